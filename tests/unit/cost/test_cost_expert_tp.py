"""The experts' own layout, expert_tp x ep x edp (MoE Parallel Folding), as the cost model prices it
(autoplan/types/expert_layout.py, cost/moe/experts.py), and the busiest EP rank's activations in memory."""

from __future__ import annotations

import math

import pytest
from synthetic import synthetic_profile
from synthetic.moe import MIXTRAL_BATCH, mixtral_graph

from autoplan.cost.model import CostModel
from autoplan.cost.moe.experts import ExpertPlacement, a2a_times_s, dispatch_bytes, grouped_gemm_s, is_expert_gemm
from autoplan.cost.network.comm import collective_time_s
from autoplan.cost.network.mesh import AxisGroup, ep_groups
from autoplan.types.moe import RoutingModel
from autoplan.types.plan import Plan

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def graph():
    return mixtral_graph()


def _plan(**changes) -> Plan:
    fields = dict(devices=4, dp=2, tp=2, pp=1, micro_batch_size=4, num_microbatches=1, precision="bf16")
    fields.update(sequence_parallel=True)
    return Plan(**{**fields, **changes})


def _pair(size: int) -> AxisGroup:
    return AxisGroup(size=size, ranks_per_node=size)


def test_a_folded_rank_routes_its_sequence_shard_and_etp_gathers_the_rows_it_received(graph):
    """S = i E C f s H b on the ep group; at etp = e the gather and reduce-scatter of e S each way, sent as
    all-to-alls of uneven parts (execute/expert_tp.py), and e copies of the E counts in the forward."""
    moe, profile, f = graph.moe_layers[0], synthetic_profile(), 4 / MIXTRAL_BATCH
    place = ExpertPlacement(ep=2, imbalance=1.5, group=_pair(2), etp=2, etp_group=_pair(2), tokens=0.5)
    message = 1.5 * moe.num_experts * moe.slots_per_expert * f * 0.5 * moe.hidden_size * 2
    assert dispatch_bytes(moe, precision="bf16", batch_fraction=f, imbalance=1.5, tokens=0.5) == pytest.approx(message)
    tokens_s = collective_time_s(profile, "all_to_all", message, group=_pair(2))
    counts_s = collective_time_s(profile, "all_to_all", moe.num_experts * 8, group=_pair(2))
    etp_s = 2 * collective_time_s(profile, "all_to_all", 2 * message, group=_pair(2))
    etp_counts_s = collective_time_s(profile, "all_to_all", 2 * moe.num_experts * 8, group=_pair(2))
    fwd, bwd = a2a_times_s(moe, profile, precision="bf16", batch_fraction=f, place=place)
    assert fwd == pytest.approx(counts_s + 2 * tokens_s + etp_counts_s + etp_s)
    assert bwd == pytest.approx(2 * tokens_s + etp_s)


def test_an_expert_gemm_runs_etp_times_the_rows_on_one_etp_th_of_its_weight(graph):
    moe = graph.moe_layers[0]
    node = next(n for n in graph.nodes if is_expert_gemm(n, moe))
    profile, f = synthetic_profile(), 4 / MIXTRAL_BATCH
    experts, slots, n_out = node.output_shape
    k_in = node.fwd_flops / (2 * experts * slots * n_out)
    place = ExpertPlacement(ep=2, imbalance=1.0, group=_pair(2), etp=2, etp_group=_pair(2), tokens=0.5)
    rows, n_local = 2 * 2 * slots * f * 0.5, n_out / 2
    flops = 2 * rows * k_in * n_local
    padded = math.ceil(rows / 128) * 128
    compute = 2 * padded * k_in * n_local / (312e12 * 0.8 * flops / (flops + 2e9))
    memory = (rows * k_in + k_in * n_local + rows * n_local) * 2 / 2.0e12
    fwd, bwd = grouped_gemm_s(node, moe, profile, precision="bf16", batch_fraction=f, place=place)
    assert fwd == pytest.approx(experts // 2 * max(compute, memory), rel=1e-12) and bwd == pytest.approx(2 * fwd)


def test_folding_splits_the_experts_over_ep_x_etp_and_syncs_them_over_edp_not_sp(graph):
    model = CostModel(graph, synthetic_profile())
    experts = sum(m.expert_params for m in graph.moe_layers)
    today = model.priced_stages(_plan())[0][0]  # ep = expert_tp = 1: the block whole on each tp rank's tokens
    assert today.expert_params == 0 and model.estimate(_plan()).ep_comm_s == 0.0
    for changes, split, edp in ((dict(ep=2), 2, 2), (dict(ep=2, expert_tp=2, devices=8, dp=4), 4, 2)):
        plan = _plan(**changes)
        stage = model.priced_stages(plan)[0][0]
        assert stage.expert_params == pytest.approx(experts / split, rel=1e-12)
        assert model.edp_group(plan).size == edp and model.estimate(plan).ep_comm_s > 0
        tp_plan, layers = model.priced_stages(plan)[1], [None, *graph.layers]
        folded = sum(model.sp_partial_elements(plan, tp_plan, layers))
        whole = sum(model.sp_partial_elements(_plan(**{**changes, "ep": 1, "expert_tp": 1}), tp_plan, layers))
        assert whole - folded == pytest.approx(experts, rel=1e-12)  # the experts leave SP's all-reduce
    assert ep_groups(model.profile, dp=2, tp=2, ep=2, pp=1)["ep"] == AxisGroup(size=2, ranks_per_node=2)


def test_folding_prices_the_same_expert_flops_per_rank_as_ep_over_dp(graph):
    """tp=2 ep=2 with SP on 4 ranks and dp=4 ep=2 at tp=1 route the same tokens per rank (mbs 4 over 2
    tp ranks vs mbs 2), so their all-to-alls carry the same bytes."""
    model = CostModel(graph, synthetic_profile())
    folded = model.expert_placement(_plan(ep=2))
    flat = model.expert_placement(_plan(dp=4, tp=1, ep=2, micro_batch_size=2, sequence_parallel=False))
    moe = graph.moe_layers[0]
    assert a2a_times_s(moe, model.profile, precision="bf16", batch_fraction=4 / MIXTRAL_BATCH, place=folded) == (
        pytest.approx(a2a_times_s(moe, model.profile, precision="bf16", batch_fraction=2 / MIXTRAL_BATCH, place=flat))
    )


def test_the_busiest_ep_rank_holds_imbalance_times_the_mean_expert_activations(graph):
    model = CostModel(graph, synthetic_profile())

    def saved(ep: int, imbalance: float) -> float:
        plan = _plan(dp=4, tp=1, ep=ep, sequence_parallel=False, routing=RoutingModel(imbalance=imbalance))
        return model.priced_stages(plan)[0][0].saved_bytes

    calm, warm, hot = saved(2, 1.0), saved(2, 1.5), saved(2, 2.0)
    assert warm > calm and hot - calm == pytest.approx(2 * (warm - calm), rel=1e-9)
    assert saved(1, 1.0) == saved(1, 2.0)  # at ep = 1 a rank holds every expert: the mean


def test_an_expert_tp_that_does_not_divide_the_expert_ffn_is_one_sentence(graph):
    from autoplan.errors import PlanError

    width = graph.moe_layers[0].expert_ffn_size  # 512
    with pytest.raises(PlanError, match=f"expert_tp=3 does not divide the expert FFN width {width}"):
        CostModel(graph, synthetic_profile()).estimate(_plan(devices=6, dp=2, tp=3, expert_tp=3))
