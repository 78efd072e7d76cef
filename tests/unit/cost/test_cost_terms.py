"""The cost model's terms priced alone, each built from a synthetic graph and profile without a
CostModel (issue 31 item 2): the tied-weight sync, the SP gradient sync, the experts' placement
and a plan's memory."""

from __future__ import annotations

from dataclasses import replace

import pytest
from synthetic import a100_profile, synthetic_gpt, synthetic_profile

from autoplan.cost.blocks import block_structure, summarise
from autoplan.cost.dp.compression import PowerSGDTraffic
from autoplan.cost.memory.plan import PlanMemory
from autoplan.cost.moe.placement import ExpertGroups, optimizer_params
from autoplan.cost.network.comm import collective_time_s
from autoplan.cost.network.mesh import AxisGroup, ep_groups, mesh_groups
from autoplan.cost.pp.tied import TiedWeightSync
from autoplan.cost.stages import StageTotals, add_block
from autoplan.cost.tp.default import default_tp_plan
from autoplan.cost.tp.sp_sync import SequenceParallelSync
from autoplan.cost.tp.splits import TPContext
from autoplan.types.moe import MoELayer, RoutingModel
from autoplan.types.plan import Plan

VOCAB, HIDDEN = 512, 64
CHUNKS = [["h.0"], ["h.1"]]


def _plan(**kw) -> Plan:
    fields = dict(dp=1, tp=1, pp=1, micro_batch_size=1, num_microbatches=1, precision="bf16")
    fields.update(kw)
    return Plan(devices=fields["dp"] * fields["tp"] * fields["pp"], **fields)


@pytest.fixture(scope="module")
def gpt():
    return synthetic_gpt(layers=2, hidden=HIDDEN, heads=4, vocab=VOCAB, seq=32, batch=4)


@pytest.fixture(scope="module")
def tied_gpt(gpt):
    """The GPT with its output head reading the input embedding's weight (GPT-2's tie)."""
    nodes = [replace(n, param_names=["wte.weight"]) if n.name == "head" else n for n in gpt.nodes]
    params = {name: info for name, info in gpt.parameters.items() if name != "head.weight"}
    return replace(gpt, nodes=nodes, parameters=params)


def _outside(graph) -> dict[str, tuple]:
    first = next(i for i, n in enumerate(graph.nodes) if n.layer is not None)
    pre, post = graph.nodes[:first], [n for n in graph.nodes[first:] if n.layer is None]
    return {"pre": tuple(pre), "post": tuple(post)}


def _outside_stages(graph, profile, plan: Plan) -> list[StageTotals]:
    """Two pipeline stages holding only the outside nodes (what the tied sync reads of them),
    priced as the plan runs them by the block pricer."""
    groups = mesh_groups(profile, dp=plan.dp, tp=plan.tp, pp=plan.pp)
    ctx = TPContext(
        profile=profile, tp=plan.tp, group=groups["tp"], sequence_parallel=False, precision="bf16", batch_fraction=1.0
    )
    tp_plan = default_tp_plan(graph, plan.tp, sequence_parallel=False)
    stages = [StageTotals(), StageTotals()]
    for stage, nodes in zip(stages, _outside(graph).values()):
        summary = summarise(
            graph, block_structure(graph, None, nodes=list(nodes)), layer=None, tp_plan=tp_plan, ctx=ctx
        )
        add_block(stage, summary, recompute="none", is_block=False)
    return stages


def test_a_tied_embedding_on_two_stages_syncs_its_tp_and_zero2_shard(tied_gpt):
    profile = a100_profile()
    tied = TiedWeightSync(tied_gpt, profile, _outside(tied_gpt))
    assert tied.places == {"wte.weight": {"pre", "post"}}
    plan = _plan(dp=2, tp=2, pp=2, zero_stage=2)
    stages = _outside_stages(tied_gpt, profile, plan)
    shard = VOCAB * HIDDEN / 2 / 2  # vocab-parallel over tp = 2, then FSDP2's gradient shard over dp = 2
    assert tied.elements_by_stage(plan, CHUNKS, stages) == {0: shard, 1: shard}
    zero1 = replace(plan, zero_stage=1)  # the sync runs on the whole (tp-sharded) gradient
    assert tied.elements_by_stage(zero1, CHUNKS, stages) == {0: 2 * shard, 1: 2 * shard}
    pp_group = mesh_groups(profile, dp=2, tp=2, pp=2)["pp"]
    expected = collective_time_s(profile, "all_reduce", shard * 4, group=pp_group)
    assert tied.sync_s(plan, CHUNKS, stages, pp_group) == expected > 0


def test_an_untied_model_or_one_stage_syncs_nothing(gpt, tied_gpt):
    profile = a100_profile()
    plan = _plan(dp=2, tp=2, pp=2, zero_stage=2)
    untied = TiedWeightSync(gpt, profile, _outside(gpt))
    assert untied.places == {} and untied.elements_by_stage(plan, CHUNKS, []) == {}
    one_stage = _plan(dp=2, tp=2, zero_stage=2)
    tied = TiedWeightSync(tied_gpt, profile, _outside(tied_gpt))
    assert tied.sync_s(one_stage, [["h.0", "h.1"]], [], AxisGroup(size=1, ranks_per_node=1)) == 0.0


def test_sequence_parallel_all_reduces_the_norm_weights_of_the_worst_stage(gpt):
    profile = a100_profile()
    sp = SequenceParallelSync(gpt, profile)
    plan = _plan(tp=2, pp=2, sequence_parallel=True)
    tp_plan = default_tp_plan(gpt, 2, sequence_parallel=True)
    assert sp.partial_elements(plan, tp_plan, ["h.0"]) == [HIDDEN, HIDDEN]  # ln_1 and ln_2
    assert sp.partial_elements(plan, tp_plan, ["h.1", None]) == [HIDDEN, HIDDEN, HIDDEN]  # and ln_f
    group = mesh_groups(profile, dp=1, tp=2, pp=2)["tp"]
    one = collective_time_s(profile, "all_reduce", HIDDEN * 4, group=group)
    assert sp.grad_sync_s(plan, tp_plan, CHUNKS, group) == 3 * one  # the last stage holds ln_f too
    assert sp.grad_sync_s(replace(plan, sequence_parallel=False), tp_plan, CHUNKS, group) == 0.0
    assert sp.partial_elements(replace(plan, sequence_parallel=False), tp_plan, ["h.0"]) == []


def test_a_replicated_linear_on_the_sp_stream_adds_no_partial_gradient(gpt):
    """The executor hands a replicated linear its input whole and gathers its output's gradient
    whole (execute/tensor_parallel.py), so its weight gradient is whole: only the norms' are partial."""
    profile = a100_profile()
    sp = SequenceParallelSync(gpt, profile)
    plan = _plan(tp=2, sequence_parallel=True)
    tp_plan = default_tp_plan(gpt, 2, sequence_parallel=True)
    group = mesh_groups(profile, dp=1, tp=2, pp=1)["tp"]
    norms_only = sp.grad_sync_s(plan, tp_plan, [["h.0", "h.1"]], group)
    tp_plan["h.0.mlp.fc2"] = "replicate"  # its output joins the sequence-sharded stream
    assert sp.grad_sync_s(plan, tp_plan, [["h.0", "h.1"]], group) == norms_only


@pytest.fixture(scope="module")
def moe_gpt(gpt):
    layer = MoELayer(
        module="h.0.mlp",
        experts_module="h.0.mlp.experts",
        layer="h.0",
        num_experts=8,
        top_k=2,
        hidden_size=HIDDEN,
        expert_ffn_size=4 * HIDDEN,
        expert_param_names=[],
        params_per_expert=3 * HIDDEN * 4 * HIDDEN,
        routing=RoutingModel(imbalance=1.5),
    )
    return replace(gpt, moe_layers=[layer])


def test_the_experts_placement_and_their_gradient_group(gpt, moe_gpt):
    profile = synthetic_profile()  # 8 devices a node
    experts = ExpertGroups(moe_gpt, profile)
    place = experts.for_plan(_plan(dp=8, ep=4))
    assert (place.ep, place.imbalance, place.group) == (4, 1.5, ep_groups(profile, dp=8, ep=4, pp=1)["ep"])
    assert experts.placement(tp=1, dp=8, ep=4, pp=1, routing=RoutingModel(imbalance=2.0)).imbalance == 2.0
    assert experts.for_plan(_plan(dp=8)).imbalance == 1.0  # every expert on the rank
    assert experts.for_plan(_plan(dp=4, tp=2)) is None  # under TP the expert matmuls are priced as ops
    assert ExpertGroups(gpt, profile).for_plan(_plan(dp=8, ep=4)) is None  # a dense model
    assert experts.edp_group(_plan(dp=8, ep=4)) == AxisGroup(size=2, ranks_per_node=2)


def test_optimizer_params_shard_dense_over_dp_and_experts_over_dp_per_ep():
    stage = StageTotals(params=1000.0, expert_params=600.0)
    assert optimizer_params(_plan(dp=8, ep=4), stage) == 1000.0
    assert optimizer_params(_plan(dp=8, ep=4, zero_stage=1), stage) == 400 / 8 + 600 / 2


def test_a_stages_memory_parts_with_experts_under_zero1():
    """Dense parameters over dp = 4, the experts over dp / ep = 1: a sharded optimizer of one rank
    keeps their whole fp32 master (cost/memory/per_device.py's table, bf16)."""
    memory = PlanMemory(a100_profile())
    plan = _plan(dp=4, ep=4, zero_stage=1)
    stage = StageTotals(params=1000.0, expert_params=600.0, saved_bytes=5000.0)
    (parts,) = memory.stage_memory(plan, [stage], [PowerSGDTraffic()])
    assert (parts.weights_bytes, parts.grads_bytes) == (6 * 1000, 4 * 1000)
    assert parts.optimizer_bytes == 12 * 400 / 4 + 12 * 600
    assert parts.activations_bytes == 5000.0


def test_powersgd_state_is_held_in_the_buffers_and_a_peak_over_the_device_is_infeasible():
    from autoplan.types.cost import Cost

    profile = a100_profile()
    memory = PlanMemory(profile)
    plan = _plan(dp=2, tp=2)
    stage = StageTotals(params=1e6, saved_bytes=1e6)
    traffic = PowerSGDTraffic(elements=1e6, p_elements=1e3, q_elements=2e3)
    (plain,) = memory.stage_memory(plan, [stage], [PowerSGDTraffic()])
    (held,) = memory.stage_memory(plan, [stage], [traffic])
    assert held.buffers_bytes - plain.buffers_bytes == pytest.approx(traffic.held_bytes + traffic.hook_bytes)
    cost = Cost()
    memory.fill(cost, plan, [stage], [traffic])
    assert cost.feasible and cost.peak_memory_bytes == int(held.peak_bytes)
    huge = StageTotals(params=profile.device.memory_bytes / 4)
    memory.fill(cost, plan, [huge], [PowerSGDTraffic()])
    assert not cost.feasible and "GiB per device" in cost.reason
