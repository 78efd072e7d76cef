"""examples/lora_llama.py (peft's LoRA adapters on examples/llama.py) traces with its base frozen, and
its plan holds less than the same model trained whole (docs/cost-model.md, "Frozen parameters")."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autoplan.cli import main
from autoplan.trace import trace_model_file

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "lora_llama.py"


def _planned(tmp_path: Path, name: str) -> dict:
    out = tmp_path / name
    args = ["plan", str(EXAMPLE), "--profile", "cpu-gloo", "--devices", "2", "--batch", "4", "--out", str(out)]
    assert main(args + ["--fix", "dp=2,zero=1"]) == 0
    return json.loads((out / "plan.json").read_text())["predicted"]


def test_lora_trains_its_adapters_only_and_plans_lighter_than_the_whole_model(tmp_path, monkeypatch):
    pytest.importorskip("peft")
    lora = trace_model_file(EXAMPLE, 2)
    assert 0 < lora.trainable_param_count < 0.1 * lora.param_count
    lora_plan = _planned(tmp_path, "lora")
    monkeypatch.setenv("AUTOPLAN_LORA_RANK", "0")  # the same model, every weight trained
    whole = trace_model_file(EXAMPLE, 2)
    assert whole.trainable_param_count == whole.param_count
    whole_plan = _planned(tmp_path, "whole")
    assert lora_plan["peak_memory_bytes"] < whole_plan["peak_memory_bytes"]
    lora_states, whole_states = lora_plan["memory"], whole_plan["memory"]
    assert lora_states["grads_bytes"] < 0.1 * whole_states["grads_bytes"]
    assert lora_states["optimizer_bytes"] < 0.1 * whole_states["optimizer_bytes"]
    assert lora_plan["breakdown"]["optimizer_s"] < whole_plan["breakdown"]["optimizer_s"]
