"""Checkpoints, failures and goodput (autoplan/cost/run/reliability.py): known answers, limits, and
the numbers reaching plan.json, the console and autoplan explain."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest
from synthetic import synthetic_gpt, synthetic_profile

from autoplan.cli import main
from autoplan.cost.run import reliability as rel
from autoplan.errors import ProfileError
from autoplan.profile import load_profile
from autoplan.report.explain import explain
from autoplan.solve.api import plan_graph
from autoplan.solve.console import goodput_line
from autoplan.types.plan import Plan
from autoplan.types.prediction import Prediction
from autoplan.types.reliability import ReliabilitySpec, StorageSpec

MIN, HOUR = 60.0, 3600.0
EXAMPLES = Path(__file__).resolve().parents[3] / "examples"


def _profile(**storage):
    """The synthetic A100 node with 1 GB/s per device to storage, a 100 GB/s cap, 1e-4 failures
    per device-hour and a 5-minute restart."""
    spec = dict(write_bytes_per_s_per_device=1e9, read_bytes_per_s_per_device=2e9, max_total_bytes_per_s=100e9)
    return dataclasses.replace(
        synthetic_profile(),
        storage=StorageSpec(source="test", **{**spec, **storage}),
        reliability=ReliabilitySpec(failures_per_device_hour=1e-4, restart_s=300.0, source="test", restart_source="t"),
    )


def test_checkpoint_is_twelve_bytes_per_parameter():
    assert rel.checkpoint_bytes(params=1e9) == 12e9  # fp32 weights 4 + AdamW exp_avg 4 + exp_avg_sq 4


def test_write_and_read_time_use_the_devices_share_until_the_cap():
    profile = _profile()
    assert rel.checkpoint_times_s(checkpoint_bytes=64e9, devices=16, profile=profile) == (4.0, 2.0)
    write_s, read_s = rel.checkpoint_times_s(checkpoint_bytes=1e12, devices=1024, profile=profile)
    assert write_s == pytest.approx(10.0) and read_s == pytest.approx(10.0)  # both capped at 100 GB/s


def test_young_interval():
    assert rel.young_interval_s(blocking_s=5 * MIN, mtbf_s=24 * HOUR) == pytest.approx(2 * HOUR)
    assert rel.young_interval_s(blocking_s=2.0, mtbf_s=100.0) == pytest.approx(20.0)


@pytest.mark.parametrize("mtbf_min, expected_min", [(24 * 60, 117), (6 * 60, 57), (15, 9.1)])
def test_daly_interval_matches_his_published_cases(mtbf_min, expected_min):
    # Daly 2006, figures 3-5: R = 10 min, delta = 5 min; "the new model predicts tau_opt = ..."
    tau = rel.daly_interval_s(blocking_s=5 * MIN, mtbf_s=mtbf_min * MIN)
    assert tau / MIN == pytest.approx(expected_min, abs=0.5 if expected_min > 10 else 0.05)


def test_daly_interval_is_the_mtbf_when_a_checkpoint_takes_twice_it():
    assert rel.daly_interval_s(blocking_s=30.0, mtbf_s=10.0) == 10.0


def test_goodput_without_failures_is_the_checkpoint_overhead_alone():
    assert rel.goodput(interval_s=99.0, blocking_s=1.0, restart_s=500.0, mtbf_s=math.inf) == pytest.approx(0.99)
    # with rare failures it tends to tau / (tau + delta) ~ 1 - delta / tau
    assert rel.goodput(interval_s=100.0, blocking_s=1.0, restart_s=10.0, mtbf_s=1e12) == pytest.approx(100 / 101)


def test_goodput_to_first_order_is_overhead_rework_and_restart():
    tau, delta, r, m = 600.0, 1.2, 300.0, 100 * HOUR  # delta / tau = 0.002, (tau / 2 + r) / m = 0.0017
    first_order = 1 - delta / tau - (tau / 2 + r) / m
    assert rel.goodput(interval_s=tau, blocking_s=delta, restart_s=r, mtbf_s=m) == pytest.approx(first_order, abs=2e-5)


def test_goodput_without_checkpoint_cost_loses_half_an_interval_per_failure():
    g = rel.goodput(interval_s=60.0, blocking_s=0.0, restart_s=0.0, mtbf_s=6000.0)
    assert g == pytest.approx(60 / (6000 * math.expm1(0.01)))
    assert g == pytest.approx(1 - 30 / 6000, rel=1e-4)


@pytest.mark.parametrize("delta, m", [(10.0, 3 * HOUR), (60.0, HOUR), (300.0, 20 * MIN)])
def test_daly_interval_maximises_goodput(delta, m):
    def g(tau):
        return rel.goodput(interval_s=tau, blocking_s=delta, restart_s=600.0, mtbf_s=m)

    tau = rel.daly_interval_s(blocking_s=delta, mtbf_s=m)
    best = max(g(tau * k / 1000) for k in range(100, 5000))
    assert g(tau) == pytest.approx(best, rel=1e-3)
    assert g(tau) > g(0.5 * tau) and g(tau) > g(2 * tau)


def test_expected_goodput_rounds_the_interval_to_whole_steps():
    profile = _profile()
    free = rel.expected_goodput(params=1e9, devices=64, profile=profile)
    assert free.checkpoint_every_steps is None
    assert free.checkpoint_write_s == pytest.approx(12e9 / 64e9)
    assert free.job_mtbf_s == pytest.approx(HOUR / (1e-4 * 64))
    assert free.restart_s == pytest.approx(300.0 + 12e9 / 100e9)  # restart + read (capped)
    assert free.checkpoint_interval_s == pytest.approx(rel.daly_interval_s(blocking_s=0.1875, mtbf_s=562500.0))
    stepped = rel.expected_goodput(params=1e9, devices=64, profile=profile, step_time_s=7.0)
    assert stepped.checkpoint_every_steps == round(free.checkpoint_interval_s / 7.0)
    assert stepped.checkpoint_interval_s == pytest.approx(7.0 * stepped.checkpoint_every_steps)
    slow = rel.expected_goodput(params=1e9, devices=64, profile=profile, step_time_s=1e6)
    assert slow.checkpoint_every_steps == 1 and slow.checkpoint_interval_s == 1e6


def test_goodput_falls_with_cluster_size():
    profile = _profile()
    values = [rel.expected_goodput(params=70e9, devices=n, profile=profile).expected_goodput for n in (64, 1024, 8192)]
    assert values[0] > values[1] > values[2] > 0


def test_async_save_blocks_only_for_staging_and_reworks_the_write():
    profile = _profile(staging_bytes_per_s_per_device=50e9)
    sync = rel.expected_goodput(params=70e9, devices=512, profile=profile)
    held = 840e9 / 512
    fast = rel.expected_goodput(params=70e9, devices=512, profile=profile, async_save=True, held_bytes=held)
    assert fast.blocking_s == pytest.approx(held / 50e9)
    assert fast.restart_s == pytest.approx(sync.restart_s + sync.checkpoint_write_s)
    assert fast.checkpoint_interval_s + fast.blocking_s >= sync.checkpoint_write_s  # one save in flight at a time
    assert fast.expected_goodput > sync.expected_goodput
    with pytest.raises(ProfileError, match="staging_bytes_per_s_per_device"):
        rel.expected_goodput(params=70e9, devices=512, profile=_profile(), async_save=True)


def test_a_profile_without_the_sections_is_not_priced_and_says_so():
    cpu = load_profile("cpu-gloo")
    assert rel.prediction_fields(params=1e6, devices=2, profile=cpu, step_time_s=0.1) == {}
    reason = rel.not_priced_reason(cpu)
    assert reason.startswith("checkpoint interval and goodput not priced") and "storage or reliability" in reason
    with pytest.raises(ProfileError, match="no storage or reliability section"):
        rel.expected_goodput(params=1e6, devices=2, profile=cpu)


def test_llama3_scale_goodput_is_near_the_published_ninety_percent():
    # Llama 3 405B on 16,384 H100s: ">90% effective training time" (Dubey et al. 2024, section 3.3.4)
    g = rel.expected_goodput(params=405e9, devices=16384, profile=load_profile("dgx-h100"))
    assert 0.9 < g.expected_goodput < 0.95


def test_prediction_fields_round_trip_through_plan_json():
    fields = rel.prediction_fields(params=1e9, devices=64, profile=_profile(), step_time_s=2.0)
    plan = Plan(devices=64, dp=64, tp=1, pp=1, micro_batch_size=1, num_microbatches=1)
    plan.predicted = Prediction(step_time_s=2.0, **fields)
    again = Plan.from_dict(json.loads(json.dumps(plan.to_dict())))
    assert again.predicted == plan.predicted and again.predicted.expected_goodput == fields["expected_goodput"]
    assert "expected_goodput" not in Prediction(step_time_s=1.0).to_dict()  # absent when not priced


def test_a_bad_goodput_in_plan_json_is_a_plan_error():
    from autoplan.errors import PlanError

    with pytest.raises(PlanError, match="expected_goodput=1.5"):
        Prediction(step_time_s=1.0, expected_goodput=1.5)
    with pytest.raises(PlanError, match="checkpoint_every_steps=0"):
        Prediction(step_time_s=1.0, checkpoint_every_steps=0)


@pytest.fixture(scope="module")
def graph():
    return synthetic_gpt(layers=4, hidden=1024, heads=16, batch=64, seq=512)


def test_the_planner_fills_the_prediction_and_console_and_explain_show_it(graph):
    profile = _profile()
    result = plan_graph(graph, devices=16, profile=profile, batch_size=64)
    predicted = result.best.predicted
    expected = rel.expected_goodput(
        params=graph.param_count, devices=16, profile=profile, step_time_s=predicted.step_time_s
    )
    assert predicted.expected_goodput == pytest.approx(expected.expected_goodput)
    assert predicted.checkpoint_every_steps == expected.checkpoint_every_steps >= 1
    line = goodput_line(predicted, profile)
    assert f"every {predicted.checkpoint_every_steps} steps" in line
    assert f"expected goodput {100 * predicted.expected_goodput:.2f}%" in line
    exp = explain(result, graph=graph, profile=profile, sensitivity=False)
    text = exp.to_markdown()
    assert "## Checkpoints and failures" in text
    assert f"expected goodput: {100 * predicted.expected_goodput:.2f}%" in text
    assert exp.to_dict()["goodput"]["checkpoint_every_steps"] == predicted.checkpoint_every_steps


def test_without_the_sections_console_and_explain_say_so_in_one_line(graph):
    profile = synthetic_profile()
    result = plan_graph(graph, devices=16, profile=profile, batch_size=64)
    assert not result.best.predicted.has_goodput
    line = goodput_line(result.best.predicted, profile)
    assert line == rel.not_priced_reason(profile)
    text = explain(result, graph=graph, profile=profile, sensitivity=False).to_markdown()
    assert text.rstrip().endswith(line)


def test_plan_cli_prints_the_goodput_line(tmp_path, capsys):
    code = main(
        [
            "plan",
            str(EXAMPLES / "mlp.py"),
            "--devices",
            "2",
            "--profile",
            "cpu-gloo",
            "--batch",
            "8",
            "--fix",
            "dp=2",
            "--out",
            str(tmp_path / "out"),
        ]
    )
    assert code == 0
    assert "checkpoint interval and goodput not priced: profile 'cpu-gloo'" in capsys.readouterr().out
