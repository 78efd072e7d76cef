"""HSDP, dp = dp_replicate x dp_shard (autoplan/types/hsdp.py): its rules, its groups on the nodes, the
messages cost/dp/messages.py states for it, their time and the memory of a shard group."""

from __future__ import annotations

from dataclasses import replace

import pytest
from synthetic import a100_profile, gpt_graph

from autoplan.cost.dp.messages import GRADS, dp_messages, per_step, replica_messages
from autoplan.cost.dp.sync import DataParallelTerms
from autoplan.cost.model import CostModel
from autoplan.cost.network.comm import collective_time_s
from autoplan.cost.network.mesh import AxisGroup, mesh_groups
from autoplan.cost.volumes import predict
from autoplan.errors import PlanError
from autoplan.types.cost import Cost
from autoplan.types.plan import Plan


def _plan(**changes) -> Plan:
    fields = dict(dp=16, tp=1, pp=1, micro_batch_size=1, num_microbatches=3, precision="bf16", zero_stage=3)
    fields.update(changes)
    return Plan(devices=fields["dp"] * fields.get("cp", 1) * fields["tp"] * fields["pp"], **fields)


@pytest.fixture(scope="module")
def model() -> CostModel:
    return CostModel(gpt_graph(layers=4, hidden=512, batch_size=16), a100_profile())


@pytest.mark.parametrize(
    "changes, says",
    [
        (dict(dp_replicate=3), "must divide dp=16"),
        (dict(dp_replicate=2, zero_stage=0), "use zero_stage 1, 2 or 3"),
        (dict(dp_replicate=16), "shard groups of one rank"),
        (dict(dp_replicate=0), "expected an integer >= 1"),
    ],
)
def test_a_bad_split_is_refused_in_one_sentence(changes, says):
    with pytest.raises(PlanError, match=says):
        _plan(**changes)


def test_beside_context_parallelism_the_shard_group_is_dp_shard_by_cp():
    """dp = 8 = 2 x 4 at cp = 2 on 8-device nodes: each shard group is 4 x 2 = 8 ranks (one node), the
    replicas 2 nodes apart; dp_replicate = dp shards over cp alone (the smallest legal split), and ep > 1
    is still refused."""
    plan = _plan(dp=8, cp=2, dp_replicate=2)
    groups = mesh_groups(a100_profile(), dp=8, tp=1, pp=1, cp=2, dp_replicate=2)
    assert groups["dp_shard"] == AxisGroup(size=8, ranks_per_node=8)
    assert groups["dp_replicate"] == AxisGroup(size=2, ranks_per_node=1)
    assert _plan(dp=2, cp=2, dp_replicate=2).dp_replicate == 2 and plan.dp_replicate == 2
    with pytest.raises(PlanError, match="shard groups of one rank"):
        _plan(dp=2, cp=1, dp_replicate=2)


def test_hsdp_beside_cp_prices_zero_over_the_shard_group_and_the_replicas_all_reduce(model):
    """The cost model's weight plan (cost/cp/weights.py) is dp x cp ranks; HSDP's shard view of it is S x cp."""
    flat, hsdp = (model.estimate(_plan(dp=8, cp=2, dp_replicate=r, zero_stage=2)) for r in (1, 2))
    assert hsdp.feasible and flat.feasible
    (pred,) = predict(model, _plan(dp=8, cp=2, dp_replicate=2, zero_stage=2))
    (full,) = predict(model, _plan(dp=8, cp=2, zero_stage=2))
    assert ("dp_replicate", "all_reduce") in pred.comm and ("dp_replicate", "all_reduce") not in full.comm
    assert pred.param_elements == 2 * full.param_elements  # FSDP2 holds 1/8 of each weight, not 1/16


def test_the_split_is_saved_only_when_it_is_not_one():
    assert "dp_replicate" not in _plan().to_dict()  # existing plans stay byte-identical
    hsdp = _plan(dp_replicate=2)
    assert Plan.from_dict(hsdp.to_dict()) == hsdp and "hsdp=2x8" in hsdp.describe()


def test_the_shard_group_stays_in_a_node_and_the_replicas_span_nodes():
    """dp = 16 on 8-device nodes, tp = 1: 2 x 8 puts each shard group on one node's NVLink."""
    groups = mesh_groups(a100_profile(), dp=16, tp=1, pp=1, dp_replicate=2)
    assert groups["dp_shard"] == AxisGroup(size=8, ranks_per_node=8)
    assert groups["dp_replicate"] == AxisGroup(size=2, ranks_per_node=1)
    flat = mesh_groups(a100_profile(), dp=16, tp=1, pp=1)
    assert flat["dp_shard"] == flat["dp"] and flat["dp_replicate"].size == 1


@pytest.mark.parametrize("zero_stage", [1, 2, 3])
def test_each_reduce_scatter_is_followed_by_the_shards_all_reduce_across_replicas(zero_stage):
    """R = 4 replicas of S = 4: ZeRO's messages as a dp = 4 plan's, plus an all-reduce of P/S (ZeRO-1: P'/S)
    gradient elements as often as the reduce-scatter."""
    hsdp, shard = _plan(zero_stage=zero_stage, dp_replicate=4), _plan(zero_stage=zero_stage, dp=4)
    messages = dp_messages(hsdp)
    assert tuple(m for m in messages if not m.replicas) == dp_messages(shard)
    (replica,) = replica_messages(messages)
    grads = next(m for m in dp_messages(shard) if m.payload == GRADS)
    assert (replica.kind, replica.payload, replica.phase, replica.micro_batches) == (
        "all_reduce",
        GRADS,
        grads.phase,
        grads.micro_batches,
    )
    (sent,) = per_step((replica,), params=1001, units=1, group_size=4, num_microbatches=3)
    padded = 1004 if zero_stage == 1 else 1001
    assert sent.message_bytes == grads.times_per_step(3) * padded / 4 * 4  # fp32 gradients


@pytest.mark.parametrize("zero_stage", [1, 3])
def test_the_replicas_all_reduce_is_priced_on_the_replicate_groups_links(model, zero_stage):
    """With no compute to hide under, the dp term is the shard group's (priced as the dp = 8 plan on its
    node) plus each block's shard all-reduced across the 2 replicas on the inter-node link."""
    hsdp, shard = _plan(zero_stage=zero_stage, dp_replicate=2), _plan(zero_stage=zero_stage, dp=8)
    stages, _, _ = model.priced_stages(hsdp)
    for stage in stages:
        stage.blocks = [replace(block, fwd_s=0.0, bwd_s=0.0) for block in stage.blocks]
    groups = mesh_groups(model.profile, dp=16, tp=1, pp=1, dp_replicate=2)
    priced, flat = Cost(), Cost()
    terms = DataParallelTerms(model.profile, model.graph)
    terms.price(priced, hsdp, stages, group=groups["dp_shard"], edp=groups["dp"], replicate=groups["dp_replicate"])
    terms.price(flat, shard, stages, group=groups["dp_shard"], edp=groups["dp"])
    grads = next(m for m in dp_messages(shard) if m.payload == GRADS)
    times = grads.times_per_step(3)
    padded = (lambda n: 8 * -(-n // 8)) if zero_stage == 1 else (lambda n: n)
    replicas = sum(
        collective_time_s(model.profile, "all_reduce", padded(b.param_count) / 8 * 4, group=groups["dp_replicate"])
        for b in stages[0].blocks
        if b.param_count
    )
    hsdp_s = priced.zero_comm_s if zero_stage == 3 else priced.dp_comm_exposed_s
    flat_s = flat.zero_comm_s if zero_stage == 3 else flat.dp_comm_exposed_s
    assert hsdp_s == pytest.approx(flat_s + times * replicas)


@pytest.mark.parametrize("zero_stage", [1, 2, 3])
def test_a_rank_holds_the_states_of_its_shard_group(model, zero_stage):
    """R x S ranks hold per device what S ranks of full sharding hold; the audit's held elements too."""
    hsdp, shard = (
        model.estimate(_plan(zero_stage=zero_stage, dp_replicate=2)),
        model.estimate(_plan(zero_stage=zero_stage, dp=8)),
    )
    assert (hsdp.weights_bytes, hsdp.grads_bytes, hsdp.optimizer_bytes) == (
        shard.weights_bytes,
        shard.grads_bytes,
        shard.optimizer_bytes,
    )
    assert hsdp.optimizer_bytes > model.estimate(_plan(zero_stage=zero_stage)).optimizer_bytes
    held = predict(model, _plan(zero_stage=zero_stage, dp_replicate=2))[0]
    assert held.param_elements == predict(model, _plan(zero_stage=zero_stage, dp=8))[0].param_elements
    assert held.comm[("dp_replicate", "all_reduce")][0] == dp_messages(_plan(dp=8, zero_stage=zero_stage))[
        -1
    ].times_per_step(3) * (1 if zero_stage == 1 else 5)
