"""Local SGD and DiLoCo (types/local_sgd.py, cost/dp/local_sgd.py): the plan's rules, one sentence each; what
syncs every step and what every H steps; the outer all-reduce's price, amortised over H, on the replicas'
links; DiLoCo's anchor and momentum in the memory."""

from __future__ import annotations

import pytest
from synthetic import gpt_graph, synthetic_profile

from autoplan.cost.dp.messages import dp_messages, replica_messages
from autoplan.cost.model import CostModel
from autoplan.cost.network.comm import collective_time_s
from autoplan.cost.network.mesh import plan_mesh_groups
from autoplan.errors import PlanError
from autoplan.types.plan import Plan

#: two sites of 8-GPU nodes joined by 10 Gb/s (1.25e9 bytes/s): the link local SGD is for
TWO_SITES = synthetic_profile(inter_busbw_bytes_per_s=1.25e9, name="two-sites")


def _plan(**changes) -> Plan:
    fields = dict(dp=16, tp=1, pp=1, micro_batch_size=1, num_microbatches=1, precision="bf16")
    fields.update(changes)
    return Plan(devices=fields["dp"] * fields["tp"] * fields["pp"], **fields)


@pytest.fixture(scope="module")
def model() -> CostModel:
    return CostModel(gpt_graph(layers=4, hidden=512, batch_size=16), TWO_SITES)


@pytest.mark.parametrize(
    "changes, says",
    [
        (dict(sync_every=0), "expected an integer >= 1"),
        (dict(outer_optimizer="adam"), "expected one of average, nesterov"),
        (dict(outer_lr=1.0), "plain averaging has no outer step"),
        (dict(outer_optimizer="nesterov", outer_momentum=1.0), "expected a number in [0, 1)"),
        (dict(sync_every=8, dp=1), "needs dp > 1 (zero_stage 0) or dp_replicate > 1"),
        (dict(sync_every=8, zero_stage=2), "leaves no replicas to average"),
        (dict(sync_every=8, zero_stage=1, dp_replicate=2), "ZeRO-1's fp32 master slices"),
        (dict(sync_every=8, grad_compression="powersgd", powersgd_rank=2), "grad_compression 'none'"),
        (dict(sync_every=8, runtime="torchtitan"), "only autoplan's executor runs the outer sync"),
    ],
)
def test_each_rule_is_one_sentence(changes, says):
    with pytest.raises(PlanError, match=None) as caught:
        _plan(**changes)
    assert says in str(caught.value) and str(caught.value).count("\n") == 0


def test_a_synchronous_plan_writes_no_new_fields_and_h_above_one_is_lossy():
    assert not {"sync_every", "outer_optimizer", "outer_lr", "outer_momentum"} & set(_plan().to_dict())
    diloco = _plan(sync_every=500, outer_optimizer="nesterov")
    assert Plan.from_dict(diloco.to_dict()) == diloco
    assert diloco.lossy == ["parameters averaged every 500 steps"] and "diloco=500(lr0.7,m0.9)" in diloco.describe()
    assert _plan(outer_optimizer="nesterov", outer_lr=1.0, outer_momentum=0.0).lossy == []


def test_gradients_sync_within_a_replica_only():
    """At H > 1: nothing per step across ZeRO-0 replicas; under HSDP the shard group's ZeRO messages and no
    all-reduce across the replicas. At H = 1 (an outer optimizer on synchronous replicas) everything as today."""
    assert dp_messages(_plan(sync_every=8)) == ()
    hsdp = _plan(zero_stage=3, dp_replicate=2)
    local = dp_messages(_plan(zero_stage=3, dp_replicate=2, sync_every=8))
    assert local == tuple(m for m in dp_messages(hsdp) if not m.replicas) and not replica_messages(local)
    assert dp_messages(_plan(outer_optimizer="nesterov")) == dp_messages(_plan())


@pytest.mark.parametrize("changes", [dict(), dict(zero_stage=3, dp_replicate=2)])
def test_the_outer_all_reduce_is_priced_once_per_h_steps_on_the_replicas_links(model, changes):
    """dp_comm = the inner sync + allreduce(4 P_l bytes over the outer group) / H, P_l the trainable parameters
    one device holds (the whole model at ZeRO-0, 1/S of it under HSDP)."""
    every = 500
    inner = model.estimate(_plan(**changes, sync_every=every)).extra
    cost = model.estimate(_plan(**changes, sync_every=every, outer_optimizer="nesterov"))
    shards = 8 if changes else 1
    local_params = gpt_graph(layers=4, hidden=512, batch_size=16).param_count / shards
    assert cost.extra["outer_sync_bytes"] == pytest.approx(4 * local_params, rel=1e-9)
    groups = plan_mesh_groups(TWO_SITES, _plan(**changes))
    outer = groups["dp_replicate"] if changes else groups["dp"]
    assert outer.spans_nodes
    sync_s = collective_time_s(TWO_SITES, "all_reduce", 4 * local_params, group=outer)
    assert cost.extra["outer_sync_s"] == pytest.approx(sync_s) and inner["outer_sync_s"] == pytest.approx(sync_s)
    without = model.estimate(_plan(**changes, sync_every=every))  # the same sync: averaging only
    assert cost.dp_comm_s == pytest.approx(without.dp_comm_s)
    synchronous = model.estimate(_plan(**changes))
    assert cost.step_time_s < synchronous.step_time_s / 2  # the slow link carries 1/500 of a sync per step


def test_diloco_holds_an_fp32_anchor_and_momentum_per_local_parameter(model):
    average = model.estimate(_plan(zero_stage=3, dp_replicate=2, sync_every=8))
    diloco = model.estimate(_plan(zero_stage=3, dp_replicate=2, sync_every=8, outer_optimizer="nesterov"))
    local_params = gpt_graph(layers=4, hidden=512, batch_size=16).param_count / 8
    assert diloco.optimizer_bytes - average.optimizer_bytes == pytest.approx(8 * local_params, rel=1e-6)
    assert diloco.peak_memory_bytes - average.peak_memory_bytes == pytest.approx(8 * local_params, rel=1e-6)
