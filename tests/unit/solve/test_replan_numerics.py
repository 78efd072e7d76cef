"""A replan keeps the numerics the checkpoint was trained with (autoplan/solve/replan.py ``numerics_pins``): an
fp32 run resumed on fewer devices was planned in bf16, and its losses drifted from the fp32 run's."""

from __future__ import annotations

from pathlib import Path

from autoplan.solve.api import plan_graph
from autoplan.solve.replan import numerics_pins, search
from autoplan.trace import trace_model_file

GPT = Path(__file__).resolve().parents[3] / "examples" / "gpt.py"


def test_an_fp32_plan_replans_in_fp32_and_a_bf16_one_may_take_fp8_only_where_it_was_searched():
    old = plan_graph(trace_model_file(GPT, 16), devices=8, profile="dgx-a100", fix={"precision": "fp32"}).best
    assert old.precision == "fp32"
    assert plan_graph(trace_model_file(GPT, 16), devices=4, profile="dgx-a100").best.precision == "bf16"
    result, _, _ = search(model=GPT, plan=old, devices=4)
    assert result.best.precision == "fp32"
    assert numerics_pins(old, allow_fp8=True) == {"precision": "fp32"}
    bf16 = plan_graph(trace_model_file(GPT, 16), devices=8, profile="dgx-a100").best
    assert numerics_pins(bf16, allow_fp8=True) == {} and numerics_pins(bf16, allow_fp8=False) == {"precision": "bf16"}
