"""Calibration refits the overlap efficiency (comm_overlap.efficiency) from runs whose sync overlaps compute."""

from __future__ import annotations

import copy

import pytest
from synthetic import gpt_graph

from autoplan.calibrate import FitOptions, Observation, fit_profile
from autoplan.calibrate.fit import predict_s
from autoplan.calibrate.params import OVERLAP_PATH, apply, candidate_parameters, get_value, owner_of
from autoplan.calibrate.record import _set_source
from autoplan.profile import load_profile
from autoplan.types.plan import Plan


def _profile(efficiency):
    profile = copy.deepcopy(load_profile("cpu-gloo"))
    profile.comm_overlap.efficiency = efficiency
    profile.devices_per_node = 4  # room for dp x pp runs on one node
    return profile


def test_overlap_is_a_capped_parameter_when_positive():
    params = {p.path: p for p in candidate_parameters(_profile(0.8), precisions={"fp32"})}
    assert params[OVERLAP_PATH].original == 0.8 and params[OVERLAP_PATH].upper == 1.0
    assert OVERLAP_PATH not in {
        p.path for p in candidate_parameters(_profile(0.0), precisions={"fp32"})
    }  # 0 cannot be scaled
    moved = apply(_profile(0.8), [params[OVERLAP_PATH]], [0.3])
    assert get_value(moved, OVERLAP_PATH) == 0.3 and owner_of(OVERLAP_PATH) == "comm_overlap"
    _set_source(moved, "comm_overlap", "calibrated on test")
    assert moved.comm_overlap.source == "calibrated on test"


def test_fit_recovers_overlap_from_ddp_runs():
    graph = gpt_graph(layers=4, hidden=256, heads=8, seq_len=128, vocab=1024, batch_size=8)
    plans = [
        Plan(devices=2, dp=2, tp=1, pp=1, micro_batch_size=8 // m, num_microbatches=m, recompute=r, precision="fp32")
        for m in (1, 2)
        for r in ("none", "full")
    ]
    plans += [
        Plan(devices=2, dp=1, tp=1, pp=2, micro_batch_size=8 // m, num_microbatches=m, precision="fp32") for m in (2, 4)
    ]
    # dp x pp syncs after the backward, fully exposed: these pin the all-reduce's own cost, so the
    # DDP runs' difference can only be the overlap
    plans += [
        Plan(devices=4, dp=2, tp=1, pp=2, micro_batch_size=4 // m, num_microbatches=m, precision="fp32") for m in (2, 4)
    ]
    truth, start = _profile(0.3), _profile(0.9)
    measured = predict_s(truth, [Observation(graph=graph, plan=p, measured_step_time_s=1.0) for p in plans])
    observations = [Observation(graph=graph, plan=p, measured_step_time_s=float(t)) for p, t in zip(plans, measured)]
    assert predict_s(start, observations)[0] < measured[0]  # more overlap predicts a faster DDP step
    result = fit_profile(
        start, observations, FitOptions(noise_sigma=0.001)
    )  # exact synthetic times: the data decide, not the prior
    found = dict(zip([p.path for p in result.fitted], result.values_after))
    assert found[OVERLAP_PATH] == pytest.approx(0.3, abs=0.05)
    assert max(abs(p / m - 1.0) for p, m in zip(result.predicted_after_s, measured)) < 0.02
