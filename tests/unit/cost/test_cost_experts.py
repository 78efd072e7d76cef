"""Expert parallelism as the cost model prices it (autoplan/cost/moe/experts.py, expert_parallel.py)."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest
from synthetic import synthetic_gpt, synthetic_profile
from synthetic.moe import mixtral_graph

from autoplan.cli import main
from autoplan.cost.compute.fp8 import Fp8Recipe, cast_bytes
from autoplan.cost.compute.roofline import memory_time_s
from autoplan.cost.memory.per_device import LOW_BYTES
from autoplan.cost.model import CostModel
from autoplan.cost.moe.experts import (
    GPU_M_TILE,
    ExpertPlacement,
    a2a_output_bytes,
    a2a_times_s,
    dispatch_bytes,
    dispatch_saved_bytes,
    grouped_gemm_s,
    is_expert_gemm,
)
from autoplan.cost.network.comm import collective_time_s
from autoplan.cost.network.mesh import AxisGroup, ep_groups
from autoplan.cost.volumes import predict
from autoplan.errors import PlanError
from autoplan.profile import load_profile
from autoplan.solve.api import plan_graph
from autoplan.solve.candidates import SearchOptions
from autoplan.solve.search import Search
from autoplan.types.moe import RoutingModel
from autoplan.types.plan import Plan

transformers = pytest.importorskip("transformers")
EXPERTS, BATCH = 8, 32
EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "hf_mixtral.py"


@pytest.fixture(scope="module")
def graph():
    return mixtral_graph()  # tests/synthetic/moe.py: traced once per session


def _plan(**changes) -> Plan:
    fields = dict(devices=8, dp=8, tp=1, pp=1, micro_batch_size=4, num_microbatches=1, precision="bf16")
    return Plan(**{**fields, **changes})


def _place(ep: int, imbalance: float = 1.0, group=None) -> ExpertPlacement:
    return ExpertPlacement(ep=ep, imbalance=imbalance, group=group or AxisGroup(size=ep, ranks_per_node=ep))


def test_an_expert_matmul_runs_as_ep_times_fewer_groups_of_ep_times_more_rows(graph):
    moe = graph.moe_layers[0]
    node = next(n for n in graph.nodes if is_expert_gemm(n, moe))
    profile, f = synthetic_profile(), 4 / BATCH
    experts, slots, n_out = node.output_shape
    k_in = node.fwd_flops / (2 * experts * slots * n_out)
    for ep in (1, 2, 8):
        rows = ep * slots * f
        flops = 2 * rows * k_in * n_out
        padded = math.ceil(rows / GPU_M_TILE) * GPU_M_TILE
        compute = 2 * padded * k_in * n_out / (312e12 * 0.8 * flops / (flops + 2e9))
        memory = (rows * k_in + k_in * n_out + rows * n_out) * 2 / 2.0e12
        fwd, bwd = grouped_gemm_s(node, moe, profile, precision="bf16", batch_fraction=f, place=_place(ep))
        assert fwd == pytest.approx(experts // ep * max(compute, memory), rel=1e-12)
        assert bwd == pytest.approx(2 * fwd, rel=1e-12)
    times = [
        grouped_gemm_s(node, moe, profile, precision="bf16", batch_fraction=f, place=_place(ep))[0] for ep in (1, 8)
    ]
    assert times[1] < times[0]  # the same FLOPs in bigger GEMMs run faster
    busy = grouped_gemm_s(node, moe, profile, precision="bf16", batch_fraction=f, place=_place(8, imbalance=2.0))[0]
    assert busy > times[1]


def test_dispatch_and_combine_cross_the_ep_group_inside_a_node_or_between_nodes(graph):
    moe, profile, f = graph.moe_layers[0], synthetic_profile(), 4 / BATCH
    message = moe.num_experts * moe.slots_per_expert * f * moe.hidden_size * 2
    assert a2a_times_s(moe, profile, precision="bf16", batch_fraction=f, place=_place(1)) == (0.0, 0.0)
    inside = ep_groups(profile, dp=16, ep=8, pp=1)["ep"]
    across = ep_groups(profile, dp=16, ep=16, pp=1)["ep"]
    assert not inside.spans_nodes and across.spans_nodes
    for group in (inside, across):
        fwd, bwd = a2a_times_s(moe, profile, precision="bf16", batch_fraction=f, place=_place(group.size, 1.5, group))
        tokens = collective_time_s(profile, "all_to_all", 1.5 * message, group=group)
        counts = collective_time_s(profile, "all_to_all", moe.num_experts * 8, group=group)
        assert fwd == pytest.approx(counts + 2 * tokens) and bwd == pytest.approx(2 * tokens)
    per_rank = [
        a2a_times_s(moe, profile, precision="bf16", batch_fraction=1.0, place=_place(g.size, 1, g))[1]
        for g in (inside, across)
    ]
    assert per_rank[1] > 5 * per_rank[0]  # the NICs, not NVLink (the whole batch: bandwidth-bound)


def test_an_expert_lives_on_one_rank_of_its_ep_group_and_syncs_over_dp_over_ep(graph):
    model = CostModel(graph, synthetic_profile())
    experts = sum(m.expert_params for m in graph.moe_layers)
    dense = graph.param_count - experts
    low = 4 + LOW_BYTES["bf16"]
    for ep in (1, 2, 8):
        plain = model.estimate(_plan(ep=ep))
        assert plain.weights_bytes == pytest.approx(low * (dense + experts / ep), rel=1e-9)
        sharded = model.estimate(_plan(ep=ep, zero_stage=3))
        assert sharded.optimizer_bytes == pytest.approx(8 * (dense + experts) / 8, rel=1e-9)
        if ep < 8:  # FSDP over the dp / ep ranks holding the same experts
            assert sharded.weights_bytes == pytest.approx(4 * (dense / 8 + experts / ep / (8 // ep)), rel=1e-9)
        else:  # ep = dp: no rank shares an expert, which stays whole (fp32 and its bf16 copy)
            assert sharded.weights_bytes == pytest.approx(4 * dense / 8 + low * experts / 8, rel=1e-9)
    edp = ep_groups(model.profile, dp=8, ep=2, pp=1)["edp"]
    assert edp == AxisGroup(size=4, ranks_per_node=4)


def test_the_all_to_alls_repeat_in_a_recomputed_forward_and_scale_with_the_imbalance(graph):
    model = CostModel(graph, synthetic_profile())
    none, full = (
        model.estimate(_plan(ep=4, recompute=r, num_microbatches=2, micro_batch_size=2)) for r in ("none", "full")
    )
    place = model.expert_placement(_plan(ep=4))
    per_layer = a2a_times_s(graph.moe_layers[0], model.profile, precision="bf16", batch_fraction=2 / BATCH, place=place)
    assert none.ep_comm_s == pytest.approx(2 * len(graph.moe_layers) * sum(per_layer), rel=1e-9)
    assert full.ep_comm_s - none.ep_comm_s == pytest.approx(2 * len(graph.moe_layers) * per_layer[0], rel=1e-9)
    slow = CostModel(graph, synthetic_profile(intra_busbw_bytes_per_s=1e9))  # bandwidth-bound all-to-alls
    calm = slow.estimate(_plan(ep=4, routing=RoutingModel(imbalance=1.0)))
    hot = slow.estimate(_plan(ep=4, routing=RoutingModel(imbalance=2.0)))
    assert hot.ep_comm_s > 1.5 * calm.ep_comm_s and hot.compute_s > calm.compute_s
    assert model.estimate(_plan(ep=1)).ep_comm_s == 0.0


def test_selective_recompute_keeps_the_all_to_alls_and_their_outputs(graph):
    """Selective recompute re-runs the block's computation but not its all-to-alls (their outputs are kept,
    types/saved_ops.py), so its EP seconds and audited messages are the plan's without recomputation and its
    kept activations hold the received rows and the combined outputs, 2 S per MoE layer; full re-sends them."""
    model = CostModel(graph, synthetic_profile())
    plans = {r: _plan(ep=4, recompute=r, num_microbatches=2, micro_batch_size=2) for r in ("none", "selective", "full")}
    costs = {r: model.estimate(p) for r, p in plans.items()}
    assert costs["selective"].ep_comm_s == pytest.approx(costs["none"].ep_comm_s, rel=1e-12)
    assert costs["full"].ep_comm_s > costs["none"].ep_comm_s
    assert costs["selective"].recompute_s > 0.0  # the block's computation still re-runs
    counts = {r: predict(model, p)[0].comm[("ep", "all_to_all")][0] for r, p in plans.items()}
    assert counts == {"none": 2 * 5 * len(graph.moe_layers), "selective": 10 * len(graph.moe_layers),
                      "full": 2 * 8 * len(graph.moe_layers)}  # fmt: skip
    moe, place = graph.moe_layers[0], model.expert_placement(plans["none"])
    rows = dispatch_bytes(moe, precision="bf16", batch_fraction=2 / BATCH, imbalance=place.imbalance)
    assert a2a_output_bytes(moe, precision="bf16", batch_fraction=2 / BATCH, place=place) == pytest.approx(2 * rows)
    assert a2a_output_bytes(moe, precision="bf16", batch_fraction=2 / BATCH, place=_place(1)) == 0.0
    balanced = dict(recompute="selective", num_microbatches=2, micro_batch_size=2, routing=RoutingModel(imbalance=1.0))
    kept, plain = (model.priced_stages(_plan(ep=ep, **balanced))[0][0] for ep in (4, 1))
    held = [sum(b.saved_bytes - b.selective_dropped_bytes for b in stage.blocks) for stage in (kept, plain)]
    assert held[0] - held[1] == pytest.approx(2 * rows / place.imbalance * len(graph.moe_layers), rel=1e-9)


def test_the_dispatch_keeps_the_combined_rows_it_weights(graph):
    """At ep > 1 the dispatch multiplies the combined rows by the routing weights outside the experts module
    (execute/expert_dispatch.py), keeping them for the weights' gradient: S per MoE layer and micro-batch beyond
    what the traced experts save, the rank's own rows whatever the routing; none at ep = 1 (the module's own
    forward), nor under Megatron, whose dispatcher weights the experts' outputs. Balanced, so that the experts'
    activations are the same at both ep."""
    model = CostModel(graph, synthetic_profile())
    balanced = dict(num_microbatches=2, micro_batch_size=2, routing=RoutingModel(imbalance=1.0))
    saved = {
        (ep, runtime): sum(
            b.saved_bytes for b in model.priced_stages(_plan(ep=ep, runtime=runtime, **balanced))[0][0].blocks
        )
        for ep in (4, 1)
        for runtime in ("autoplan", "megatron")
    }
    moe = graph.moe_layers[0]
    rows = dispatch_bytes(moe, precision="bf16", batch_fraction=2 / BATCH, imbalance=1.0)
    assert saved[4, "autoplan"] - saved[1, "autoplan"] == pytest.approx(rows * len(graph.moe_layers), rel=1e-9)
    assert saved[4, "megatron"] == pytest.approx(saved[1, "megatron"], rel=1e-12)  # its dispatcher weights them
    assert dispatch_saved_bytes(moe, precision="bf16", batch_fraction=2 / BATCH, place=_place(4, 2.0)) == rows
    assert dispatch_saved_bytes(moe, precision="bf16", batch_fraction=2 / BATCH, place=_place(1)) == 0.0


def test_fp8_reaches_the_grouped_experts_only_where_the_runtime_runs_them_so(graph):
    """Megatron-Core runs its experts as TE linears under FP8 (compute/fp8.py ``FP8_EXPERT_RUNTIMES``): each
    expert GEMM at the FP8 peak plus its recipe's casts of every local expert's rows and weights; autoplan's
    executor converts nn.Linear only, so its fp8 plans keep the experts at the 16-bit peak, as priced before."""
    profile = load_profile("dgx-h100")
    moe = graph.moe_layers[0]
    node = next(n for n in graph.nodes if is_expert_gemm(n, moe))
    f, place = 1.0, _place(8)  # the whole batch over ep = 8: compute-bound grouped GEMMs
    times = {
        runtime: grouped_gemm_s(
            node,
            moe,
            profile,
            precision="fp8",
            batch_fraction=f,
            place=place,
            recipe=Fp8Recipe.of(recipe="te_current", num_microbatches=4, runtime=runtime),  # fmt: skip
        )
        for runtime in ("autoplan", "megatron")
    }
    bf16 = grouped_gemm_s(node, moe, profile, precision="bf16", batch_fraction=f, place=place)
    assert times["autoplan"] == pytest.approx(bf16, rel=1e-12)
    experts, slots, n_out = node.output_shape
    k_in, groups = node.fwd_flops / (2 * experts * slots * n_out), experts // 8
    rows = 8 * slots * f
    flops = 2 * rows * k_in * n_out
    device = profile.device
    gemm = 2 * math.ceil(rows / GPU_M_TILE) * GPU_M_TILE * k_in * n_out
    gemm /= device.peak_flops["fp8"] * device.efficiency_for("grouped_matmul", "fp8")(flops)
    recipe = Fp8Recipe.of(recipe="te_current", num_microbatches=4, runtime="megatron")
    shape = dict(rows=groups * rows, k=k_in, n=n_out, weights=groups * k_in * n_out, recipe=recipe)
    casts = [memory_time_s(profile, cast_bytes(**shape, backward=b)) for b in (False, True)]
    moved = (rows * k_in + k_in * n_out + rows * n_out) * 2  # operands read and written in bf16
    one = groups * max(gemm, moved / (device.memory_bandwidth_bytes_per_s * device.memory_efficiency))
    assert times["megatron"] == pytest.approx((one + casts[0], 2 * one + casts[1]), rel=1e-9)
    model = CostModel(graph, profile)  # the block summaries price each expert GEMM so

    def experts_s(**changes) -> float:
        return sum(b.expert_fwd_s for b in model.priced_stages(_plan(ep=8, **changes))[0][0].blocks)

    assert experts_s(precision="fp8", fp8_recipe="rowwise") == pytest.approx(experts_s(), rel=1e-12)
    megatron = experts_s(precision="fp8", runtime="megatron", fp8_recipe="te_current")
    assert megatron != pytest.approx(experts_s(runtime="megatron"), rel=1e-3)


def test_the_search_offers_ep_and_the_plan_keeps_its_routing_model(graph):
    result = plan_graph(graph, devices=8, profile=synthetic_profile(), batch_size=BATCH, top_k=3)
    eps = {c.config["ep"] for c in result.candidates}
    assert eps == {1, 2, 4, 8}
    assert all(c.plan.tp == 1 for c in result.candidates if c.plan is not None and c.plan.ep > 1)
    pinned = plan_graph(graph, devices=8, profile=synthetic_profile(), batch_size=BATCH, fix="ep=2").best
    assert pinned.ep == 2 and pinned.routing == graph.moe_layers[0].routing


def test_bounds_stay_below_what_expert_parallel_plans_are_priced_at(graph):
    search = Search(
        graph, synthetic_profile(memory_bytes=2**30), SearchOptions(devices=16, batch_size=BATCH, keep=10**6)
    )
    search._usable_bytes = float("inf")
    search.memory_first = False  # and the time of every plan that does not fit
    result = search.run()
    priced = [c for c in result.candidates if c.cost is not None]
    assert any(c.plan.ep > 1 for c in priced) and any(c.plan.ep > 1 and c.plan.pp > 1 for c in priced)
    assert all(c.lower_bound <= c.objective * (1 + 1e-9) for c in priced)
    assert all(search.bounds.states_floor_bytes(c.plan) <= c.cost.peak_memory_bytes * (1 + 1e-12) for c in priced)


def test_bounds_stay_below_megatrons_fp8_experts(graph):
    """Under Megatron-Core's FP8 the experts run at the FP8 peak (compute/fp8.py): the search's floor, which
    prices every fp8 plan's experts there without casts, stays below each priced candidate."""
    profile = dataclasses.replace(load_profile("dgx-h100"), devices_per_node=8)
    options = SearchOptions(devices=16, batch_size=BATCH, keep=10**6, runtime="megatron", fixes={"precision": "fp8"})
    search = Search(graph, profile, options)
    search._usable_bytes = float("inf")
    search.memory_first = False  # and the time of every plan that does not fit
    priced = [c for c in search.run().candidates if c.cost is not None]
    assert any(c.plan.ep > 1 and c.plan.precision == "fp8" for c in priced)
    assert all(c.lower_bound <= c.objective * (1 + 1e-9) for c in priced)


@pytest.mark.parametrize(
    "fix, words",
    [("ep=3", "does not divide the model's 8 experts"), ("ep=16", "does not divide the model's 8 experts")],
)
def test_an_ep_the_experts_cannot_take_is_one_sentence(graph, fix, words):
    with pytest.raises(PlanError) as info:
        plan_graph(graph, devices=16, profile=synthetic_profile(), batch_size=BATCH, fix=fix)
    assert "ep=" in str(info.value) and "8 experts" in str(info.value) and "\n" not in str(info.value)


def test_ep_on_a_dense_model_or_a_plan_that_splits_experts_unevenly_is_refused(graph):
    dense = synthetic_gpt(layers=2, hidden=128, heads=4, vocab=512, seq=64, batch=8)
    with pytest.raises(PlanError, match="no MoE layers"):
        plan_graph(dense, devices=8, profile=synthetic_profile(), batch_size=8, fix="ep=2")
    with pytest.raises(PlanError, match=r"ep=6 does not divide the 8 experts of MoE layer 'model\.layers\.0\.mlp'"):
        CostModel(graph, synthetic_profile()).estimate(_plan(devices=6, dp=6, ep=6, micro_batch_size=1))


def test_plan_cli_pins_ep_and_writes_it(tmp_path, monkeypatch):
    for name, value in dict(LAYERS=2, DIM=64, FFN=128, EXPERTS=4, VOCAB=512, SEQ=32).items():
        monkeypatch.setenv(f"AUTOPLAN_HF_MIXTRAL_{name}", str(value))
    out = tmp_path / "out"
    code = main(["plan", str(EXAMPLE), "--devices", "8", "--profile", "dgx-h100", "--batch", "16",
                 "--fix", "ep=4", "--out", str(out)])  # fmt: skip
    assert code == 0
    plan = json.loads((out / "plan.json").read_text())
    assert plan["ep"] == 4 and plan["routing"]["imbalance"] == 1.25
    header = (out / "plans.csv").read_text().splitlines()[0].split(",")
    assert "ep" in header and "ep_comm_s" in header
    bad = main(["plan", str(EXAMPLE), "--devices", "8", "--profile", "dgx-h100", "--batch", "16",
                "--fix", "ep=8", "--out", str(tmp_path / "bad")])  # fmt: skip
    assert bad != 0


def test_an_expert_matmul_with_a_bias_is_a_grouped_gemm_too(graph):
    """GPT-OSS adds its experts' biases to the bmm, which the tracer classifies as a linear."""
    from dataclasses import replace

    moe = graph.moe_layers[0]
    node = next(n for n in graph.nodes if is_expert_gemm(n, moe))
    assert is_expert_gemm(replace(node, op="linear"), moe)
    assert not is_expert_gemm(replace(node, output_shape=[2, *node.output_shape[1:]]), moe)


def test_explain_names_expert_parallel_families_and_only_true_bounds(tmp_path, monkeypatch, capsys):
    import re

    for name, value in dict(LAYERS=2, DIM=64, FFN=128, EXPERTS=4, VOCAB=512, SEQ=32).items():
        monkeypatch.setenv(f"AUTOPLAN_HF_MIXTRAL_{name}", str(value))
    code = main(["plan", str(EXAMPLE), "--devices", "8", "--profile", "dgx-h100", "--batch", "16",
                 "--out", str(tmp_path / "out"), "--explain", "--json"])  # fmt: skip
    assert code == 0
    text = json.dumps(json.loads(capsys.readouterr().out)["explanation"])
    assert re.search(r"dp=\d+ ep=\d+ tp=1", text)
    claims = re.findall(r"its lower bound ([0-9.e+-]+) is already above the best ([0-9.e+-]+)", text)
    assert all(float(bound) >= float(best) for bound, best in claims)


def test_a_router_that_is_not_an_nn_linear_is_never_split(graph):
    """Mixtral's router (MixtralTopKRouter) calls F.linear on its own weight; the executor splits
    nn.Linear modules only, so the cost model and the default tp plan keep it whole."""
    from autoplan.cost.tp.default import default_tp_plan
    from autoplan.cost.tp.splits import legal_splits

    routers = [n for n in graph.nodes if n.op == "linear" and n.module.endswith("mlp.gate")]
    assert routers and all(n.attrs["tp_splittable"] is False for n in routers)
    assert all(legal_splits(n, 2) == ("replicate",) for n in routers)
    plan = default_tp_plan(graph, 2)
    assert plan["model.layers.0.self_attn.q_proj"] == "colwise" and "model.layers.0.mlp.gate" not in plan


def test_with_ddp_the_experts_all_reduce_after_the_backward_is_exposed(graph):
    """DDP ignores the expert parameters and ExpertParallel.sync_grads all-reduces them over edp
    after the backward: their sync is priced exposed, on top of the dense one; at ep = dp no rank
    shares an expert and nothing is sent."""
    model = CostModel(graph, synthetic_profile())
    plan = _plan(ep=2)
    cost = model.estimate(plan)
    held = sum(m.expert_params for m in graph.moe_layers) / 2  # this rank's experts, fp32 gradients
    edp = ep_groups(model.profile, dp=8, ep=2, pp=1)["edp"]
    after = collective_time_s(model.profile, "all_reduce", held * 4, group=edp)
    assert cost.dp_comm_exposed_s >= after
    dense_only = model.estimate(_plan(ep=8))  # edp = 1: the experts' all-reduce is not sent
    assert cost.dp_comm_exposed_s >= dense_only.dp_comm_exposed_s + after * (1 - 1e-9)


def test_under_sequence_parallelism_an_moe_block_runs_on_the_sequence_shard(graph):
    """tp=2 with SP: the MoE block's nodes take no split, compute and keep 1/tp (the rank's
    tokens), send nothing, and every weight of the block is in the SP gradient sync."""
    from autoplan.cost.tp.block import analyse_block
    from autoplan.cost.tp.default import default_tp_plan
    from autoplan.cost.tp.shards import shards
    from autoplan.cost.tp.sp_sync import sp_partial_params
    from autoplan.cost.tp.splits import block_messages, node_splits

    layer, moe = graph.layers[0], graph.moe_layers[0]
    block = analyse_block(graph, layer)
    inside = {n.name for n in block.nodes if n.module == moe.module or n.module.startswith(moe.module + ".")}
    assert inside and block.token_wise == inside and not inside & set(block.params)
    tp_plan = default_tp_plan(graph, 2, sequence_parallel=True)
    assert not [m for m in tp_plan if m.startswith(moe.module + ".")]
    compute, param, act = shards(graph, layer, node_splits(graph, layer, tp_plan, tp=2), tp=2, sequence_parallel=True)
    assert all(compute[n] == 2 and act[n] == 2 and param[n] == 1 for n in inside)
    synced = set(sp_partial_params(graph, layer, tp_plan, tp=2, sequence_parallel=True))
    assert set(moe.expert_param_names) <= synced and f"{moe.router_module}.weight" in synced
    model = CostModel(graph, synthetic_profile())
    _stages, _tp, ctx = model.priced_stages(_plan(dp=1, tp=2, devices=2, sequence_parallel=True, tp_plan=tp_plan))
    fwd, bwd = block_messages(graph, layer, tp_plan, ctx=ctx)
    attention_only = {k: c for k, (c, _) in (fwd + bwd).by_kind.items()}
    assert attention_only == {"all_gather": 2, "reduce_scatter": 2}  # qkv's input and o_proj's output, each way


def test_sequence_parallelism_is_not_offered_to_moe_blocks_inside_a_pipeline(graph):
    """An MoE block runs on the rank's sequence shard, which a pipeline stage's exported graph
    (shaped for the whole sequence) cannot: the search leaves SP out under pp > 1 for this model,
    a pin of both is one sentence, and the executor refuses such a plan in one sentence too."""
    from autoplan.solve import sequence_parallel

    assert sequence_parallel.sp_options(tp=2, seq_lens=(128,), fixes={}, pp=2, moe=True) == [False]
    assert sequence_parallel.sp_options(tp=2, seq_lens=(128,), fixes={}, pp=1, moe=True) == [False, True]
    with pytest.raises(PlanError, match="sequence shard inside a pipeline"):
        sequence_parallel.sp_options(tp=2, seq_lens=(128,), fixes={"sp": True, "pp": 2}, pp=2, moe=True)
    from autoplan.execute.expert_sequence import check_unsplit

    plan = _plan(dp=2, tp=2, pp=2, sequence_parallel=True)
    with pytest.raises(PlanError, match="sequence shard inside a pipeline"):
        check_unsplit(plan=plan, blocks=["model.layers.0.mlp"])
