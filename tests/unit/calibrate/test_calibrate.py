"""The refit on synthetic measurements with a known answer.

"Measured" step times come from the cost model itself on a copy of the shipped cpu-gloo profile
with three numbers perturbed by known factors; the refit starts from the unperturbed profile and
must find those factors, reproduce the times it saw, and predict plans it never saw.
"""

from __future__ import annotations

import math
import statistics

import pytest
from synthetic import gpt_graph

from autoplan.calibrate import CalibrationError, FitOptions, Observation, calibrate_observations, fit_profile
from autoplan.calibrate.fit import predict_s
from autoplan.calibrate.params import apply, candidate_parameters, get_value
from autoplan.profile import load_profile
from autoplan.types.plan import Plan

TRUTH = {
    "device.memory_efficiency": 0.5,
    "device.efficiency_by_dtype.fp32.matmul.max_efficiency": 0.7,
    "intra_node.collectives.all_reduce.busbw_bytes_per_s": 0.5,
}


def _plans() -> list[Plan]:
    plans = []
    for precision in ("fp32", "bf16"):
        for zero in (0, 1, 2, 3):
            for recompute in ("none", "full"):
                plans.append(
                    Plan(
                        devices=2,
                        dp=2,
                        tp=1,
                        pp=1,
                        micro_batch_size=4,
                        num_microbatches=1,
                        zero_stage=zero,
                        recompute=recompute,
                        precision=precision,
                    )
                )
        for sp in (False, True):
            plans.append(
                Plan(
                    devices=2,
                    dp=1,
                    tp=2,
                    pp=1,
                    micro_batch_size=8,
                    num_microbatches=1,
                    sequence_parallel=sp,
                    precision=precision,
                )
            )
        for schedule in ("gpipe", "1f1b"):
            for m in (2, 4, 8):
                plans.append(
                    Plan(
                        devices=2,
                        dp=1,
                        tp=1,
                        pp=2,
                        micro_batch_size=8 // m,
                        num_microbatches=m,
                        schedule=schedule,
                        precision=precision,
                    )
                )
    return plans


@pytest.fixture(scope="module")
def setup():
    profile = load_profile("cpu-gloo")
    graph = gpt_graph(layers=4, hidden=256, heads=8, seq_len=128, vocab=1024, batch_size=8)
    candidates = {p.path: p for p in candidate_parameters(profile, precisions={"fp32", "bf16"})}
    truth = apply(profile, [candidates[k] for k in TRUTH], [candidates[k].original * f for k, f in TRUTH.items()])
    plans = _plans()
    measured = predict_s(truth, [Observation(graph=graph, plan=p, measured_step_time_s=1.0) for p in plans])
    observations = [
        Observation(graph=graph, plan=p, measured_step_time_s=float(t), label=p.describe())
        for p, t in zip(plans, measured)
    ]
    return profile, observations[::2], observations[1::2]


def _param(profile, path):
    return {p.path: p for p in candidate_parameters(profile, precisions={"fp32", "bf16"})}[path]


def _abs_errors(predicted, observations):
    return [abs(p / o.measured_step_time_s - 1.0) for p, o in zip(predicted, observations)]


@pytest.fixture(scope="module")
def fitted(setup):
    """The refit of the training half, which three tests judge: on the times it saw, on the held-out half and
    on the parameters it leaves alone."""
    profile, train, _ = setup
    return fit_profile(profile, train, FitOptions(noise_sigma=0.01))  # synthetic times are exact: little noise


def test_recovers_perturbed_parameters_and_times(setup, fitted):
    profile, train, _ = setup
    result = fitted
    found = {p.path: v / p.original for p, v in zip(result.fitted, result.values_after)}
    for path, factor in TRUTH.items():
        assert found[path] == pytest.approx(factor, rel=0.1), path
    assert max(_abs_errors(result.predicted_after_s, train)) < 0.02
    assert statistics.median(_abs_errors(result.predicted_before_s, train)) > 0.1  # the perturbation mattered


def test_held_out_plans_improve(setup, fitted):
    profile, _, test = setup
    result = fitted
    before = _abs_errors(predict_s(profile, test), test)
    after = _abs_errors(predict_s(result.profile, test), test)
    assert statistics.median(after) < 0.02 < statistics.median(before)
    assert max(after) < max(before)


def test_only_informed_parameters_move(setup, fitted):
    """On the module's refit (noise_sigma 0.01): the parameters no run informs stay where they were."""
    profile, train, _ = setup
    result = fitted
    assert "intra_node.collectives.all_to_all.busbw_bytes_per_s" in result.unused  # no plan uses all_to_all
    assert not set(TRUTH) & set(result.unused)  # the numbers the runs do carry information about move
    base = predict_s(profile, train)
    for path in result.unused:  # "unused" means: doubling it moves no run's prediction
        doubled = predict_s(apply(profile, [_param(profile, path)], [2 * get_value(profile, path)]), train)
        assert all(abs(d / b - 1.0) < 1e-3 for d, b in zip(doubled, base)), path
    assert get_value(result.profile, "intra_node.collectives.all_to_all.busbw_bytes_per_s") == get_value(
        profile, "intra_node.collectives.all_to_all.busbw_bytes_per_s"
    )


def test_bounds_hold_when_measurements_are_far_off():
    profile = load_profile("cpu-gloo")
    graph = gpt_graph(layers=2, hidden=128, heads=4, seq_len=64, vocab=512, batch_size=4)
    plan = Plan(devices=2, dp=2, tp=1, pp=1, micro_batch_size=2, num_microbatches=1)
    fast = predict_s(profile, [Observation(graph=graph, plan=plan, measured_step_time_s=1.0)])[0] / 100.0
    result = fit_profile(profile, [Observation(graph=graph, plan=plan, measured_step_time_s=fast)])
    for param, value in zip(result.fitted, result.values_after):
        assert value <= param.upper
        assert math.exp(-math.log(20.0)) - 1e-9 <= value / param.original <= 20.0 + 1e-9
    assert result.profile.device.efficiency_by_dtype["fp32"]["matmul"].max_efficiency <= 1.0


def test_calibration_record_and_sources(setup):
    profile, train, _ = setup
    calibrated = calibrate_observations(train[:6], profile=profile, origin="cpu-gloo").profile
    record = calibrated.calibration
    assert record["from_profile"] == "cpu-gloo" and len(record["runs"]) == 6
    assert record["error_after"]["median_abs_pct"] < record["error_before"]["median_abs_pct"]
    assert {"measured_step_time_s", "predicted_before_s", "predicted_after_s", "plan"} <= set(record["runs"][0])
    for path in record["parameters"]:
        if path.startswith("intra_node"):
            kind = path.split(".")[2]
            assert calibrated.intra_node.collectives[kind].source.startswith("calibrated on")
    assert profile.calibration == {}  # the input profile is not modified
    type(calibrated).from_dict(calibrated.to_dict())  # still a valid profile


def test_no_runs_is_a_clear_error():
    with pytest.raises(CalibrationError, match="no measured runs"):
        fit_profile(load_profile("cpu-gloo"), [])


def test_op_overhead_is_refittable_and_written_back():
    from autoplan.calibrate.params import set_value

    profile = load_profile("cpu-gloo")
    paths = {p.path for p in candidate_parameters(profile, precisions={"fp32"})}
    assert {"device.op_overhead.forward_s", "device.op_overhead.backward_s"} <= paths
    set_value(profile, "device.op_overhead.backward_s", 4e-5)
    assert get_value(profile, "device.op_overhead.backward_s") == profile.device.op_overhead.backward_s == 4e-5
    profile.device.op_overhead = None
    assert not any("op_overhead" in p.path for p in candidate_parameters(profile, precisions={"fp32"}))
