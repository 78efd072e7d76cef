"""Offload (issue 34 item 2): the profile's host section, the plan field, and its price.

Memory: the offloaded states leave the device exactly and land on the host (16 B per parameter of a
rank's slice); time: the optimizer term becomes the link copies and the CPU Adam step
(autoplan/cost/memory/offload.py). Plans at offload "none" price as before.
"""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from synthetic import synthetic_gpt, synthetic_host, synthetic_profile

from autoplan.cost import CostModel
from autoplan.errors import PlanError, ProfileError
from autoplan.profile.io import load_profile
from autoplan.types.plan import Plan
from autoplan.types.profile import Profile

HOST = synthetic_host()


@pytest.fixture(scope="module")
def graph():
    return synthetic_gpt(layers=4, hidden=1024, heads=16, vocab=32000, seq=1024, batch=8)


@pytest.fixture(scope="module")
def model(graph):
    return CostModel(graph, replace(synthetic_profile(), host=HOST))


def _plan(zero: int, offload: str = "none", **kw) -> Plan:
    base = dict(devices=8, dp=8, tp=1, pp=1, micro_batch_size=1, num_microbatches=1, precision="bf16")
    return Plan(**{**base, **kw}, zero_stage=zero, offload=offload)


def test_a_profile_without_host_loads_and_a_bad_host_is_one_sentence():
    assert load_profile("dgx-h100").host.link_bytes_per_s == pytest.approx(55.06e9)
    assert synthetic_profile().host is None and "host" not in synthetic_profile().to_dict()
    data = replace(synthetic_profile(), host=HOST).to_dict()
    data["host"]["link_bytes_per_s"] = -1
    with pytest.raises(ProfileError, match="'host.link_bytes_per_s' is -1; expected a positive number"):
        Profile.from_dict(data)


def test_the_plan_field_is_checked_and_omitted_at_its_default():
    assert "offload" not in _plan(1).to_dict()
    assert Plan.from_dict(_plan(1, "optimizer").to_dict()).offload == "optimizer"
    with pytest.raises(PlanError, match=r"needs zero_stage 1, dp > 1 \(or zero_stage 0 on one dp x cp rank\)"):
        _plan(2, "optimizer")
    with pytest.raises(PlanError, match="offload='full' with pp > 1"):
        _plan(3, "full", dp=4, pp=2, stages=[["blocks.0", "blocks.1"], ["blocks.2", "blocks.3"]])
    with pytest.raises(PlanError, match="expected one of none, optimizer, full"):
        _plan(1, "disk")
    with pytest.raises(PlanError, match="runtime 'megatron': that runtime does not run it"):
        _plan(3, "full", runtime="megatron")


def test_optimizer_offload_moves_exactly_the_master_and_moments(model):
    kept, moved = model.estimate(_plan(1)), model.estimate(_plan(1, "optimizer"))
    params = model.graph.param_count
    assert kept.optimizer_bytes == int(12 * params / 8) and moved.optimizer_bytes == 0
    assert kept.peak_memory_bytes - moved.peak_memory_bytes == pytest.approx(kept.optimizer_bytes, abs=1)
    assert moved.extra["host_bytes"] == 16 * math.ceil(params / 8)


def test_full_offload_leaves_no_state_on_the_device(model):
    moved = model.estimate(_plan(3, "full"))
    assert (moved.weights_bytes, moved.grads_bytes, moved.optimizer_bytes) == (0, 0, 0)
    assert moved.peak_memory_bytes < model.estimate(_plan(3)).peak_memory_bytes


def test_the_step_pays_the_copies_and_the_cpu_adam(model):
    """autoplan's executor copies in series: r P' down, 4 P' up, then P' / A on the host."""
    mine = math.ceil(model.graph.param_count / 8)
    cost = model.estimate(_plan(1, "optimizer"))
    expected = (4 * mine + 4 * mine) / HOST.link_bytes_per_s + mine / HOST.adam_params_per_s
    assert cost.optimizer_s == pytest.approx(expected, rel=1e-12)
    bf16 = model.estimate(_plan(1, "optimizer", grad_reduce_dtype="bf16"))
    assert bf16.extra["offload"]["down_bytes"] == 2 * mine
    rest = [name for name in cost.TIME_FIELDS if name != "optimizer_s"]
    assert [getattr(cost, n) for n in rest] == [getattr(model.estimate(_plan(1)), n) for n in rest]


def test_deepspeed_hides_the_gradient_copy_under_the_backward(model):
    ours = model.estimate(_plan(1, "optimizer")).extra["offload"]
    theirs = model.estimate(_plan(1, "optimizer", runtime="deepspeed")).extra["offload"]
    assert theirs["copy_s"] < ours["copy_s"]


def test_a_host_too_small_is_one_sentence(graph):
    small = replace(HOST, host_memory_bytes_per_device=2**20)
    cost = CostModel(graph, replace(synthetic_profile(), host=small)).estimate(_plan(1, "optimizer"))
    assert not cost.feasible and "GiB of host memory per device but the host has 0.0 GiB" in cost.reason


def test_a_profile_without_host_cannot_price_offload(graph):
    with pytest.raises(PlanError, match="has no host section"):
        CostModel(graph, synthetic_profile()).estimate(_plan(1, "optimizer"))
