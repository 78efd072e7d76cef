"""Context parallelism's price (issue 32, item 2): what each variant sends against hand formulas,
its exposed time on hand-made inputs, attention's work per rank against counting query-key pairs,
and a Llama-2-7B-shaped model at 128K tokens on dgx-h100 priced through CostModel."""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest
from synthetic import synthetic_gpt, synthetic_profile

from autoplan.cost import CostModel, block_time_s, predict_volumes, priced_ops
from autoplan.cost.blocks import block_structure, summarise
from autoplan.cost.bounds import Bounds
from autoplan.cost.cp.exposed import busiest_share, executed_fraction, exposed_s
from autoplan.cost.cp.messages import RING_GRAD_BYTES, CpMessage, attention_bytes, attention_messages
from autoplan.cost.network.comm import collective_time_s
from autoplan.cost.network.mesh import AxisGroup, mesh_groups
from autoplan.cost.tp.split_prices import price_block
from autoplan.errors import PlanError
from autoplan.profile.io import load_profile
from autoplan.solve.stage_costs import StageCosts
from autoplan.types.plan import Plan

SEQ, HEADS, KV_HEADS, HIDDEN, BATCH = 1024, 8, 2, 512, 8
HEAD_DIM = HIDDEN // HEADS


def _plan(**kw) -> Plan:
    fields = dict(dp=1, tp=1, pp=1, cp=1, micro_batch_size=1, num_microbatches=2, precision="bf16")
    fields.update(kw)
    return Plan(devices=fields["dp"] * fields["tp"] * fields["pp"] * fields["cp"], **fields)


@pytest.fixture(scope="module")
def gqa():
    """A causal GQA GPT (8 query heads, 2 KV heads) traced at a sequence of 1,024 and batch 8."""
    return synthetic_gpt(layers=2, hidden=HIDDEN, heads=HEADS, kv_heads=KV_HEADS, vocab=1024, seq=SEQ, batch=BATCH)


@pytest.fixture(scope="module")
def gqa_model(gqa):
    return CostModel(gqa, synthetic_profile())


@pytest.fixture(scope="module")
def llama7b():
    """Llama-2-7B's shape (32 layers, hidden 4096, 32 heads, FFN 11008) at 128K tokens, global batch 32."""
    graph = synthetic_gpt(layers=32, hidden=4096, heads=32, ffn=11008, vocab=32000, seq=131072, batch=32)
    return CostModel(graph, load_profile("dgx-h100"))


def _attention(graph):
    return next(n for n in graph.nodes if n.op == "attention")


# ---- the statement --------------------------------------------------------------------------
def test_each_variant_sends_the_hand_formula_bytes(gqa):
    """K = B Hkv S D E per micro-batch and rank (B = 1 of the traced 8, E = 2 in bf16), Q = B H S D E."""
    k, q, n = 1 * KV_HEADS * SEQ * HEAD_DIM * 2, 1 * HEADS * SEQ * HEAD_DIM * 2, 4
    tensors = attention_bytes(_attention(gqa), precision="bf16", micro_batch_fraction=1 / BATCH, shard=1)
    assert (tensors.key_bytes, tensors.query_bytes, tensors.element_bytes) == (k, q, 2)
    sent = {v: attention_messages(v, cp=n, tensors=tensors) for v in ("allgather", "ring", "ulysses")}
    assert sent["allgather"] == (
        CpMessage("all_gather", 2 * k, 1, "forward"),
        CpMessage("reduce_scatter", 2 * k, 1, "backward"),
    )
    ring = [(m.kind, m.message_bytes, m.count, m.phase, m.overlap) for m in sent["ring"]]
    assert ring == [
        ("send_recv", 2 * k / n, n - 1, "forward", 1 / n),
        ("send_recv", 2 * k / n, n - 1, "backward", 1 / n),
        ("send_recv", 2 * k / n * RING_GRAD_BYTES / 2, n, "backward", 1 / n),  # dK, dV in fp32
    ]
    ulysses = [(m.kind, m.message_bytes, m.phase) for m in sent["ulysses"]]
    assert ulysses == [("all_to_all", b / n, p) for p in ("forward", "backward") for b in (q, k, k, q)]
    assert attention_messages("ring", cp=1, tensors=tensors) == ()
    halved = attention_bytes(_attention(gqa), precision="bf16", micro_batch_fraction=1 / BATCH, shard=2)
    assert halved.key_bytes == k / 2  # a tp rank holds half the heads


def test_the_exposed_time_is_the_transfer_left_after_the_attention_beside_it():
    """A ring step of time t beside a block of A/n shows t - eta min(t, A/n); the all-gather shows whole."""
    profile = synthetic_profile()
    eta = profile.comm_overlap.efficiency
    group = AxisGroup(size=4, ranks_per_node=4)
    step = CpMessage("send_recv", 64e6, 3, "forward", 0.25)
    gather = CpMessage("all_gather", 256e6, 1, "forward")
    t_step = collective_time_s(profile, "send_recv", 64e6, group=group)
    t_gather = collective_time_s(profile, "all_gather", 256e6, group=group)
    for attention_s in (0.0, t_step, 4 * t_step, 100 * t_step):  # A/n below, at and above the step's transfer
        fwd, bwd = exposed_s(
            (step, gather), profile=profile, group=group, attention_fwd_s=attention_s, attention_bwd_s=1.0
        )
        assert bwd == 0.0
        assert fwd == pytest.approx(3 * (t_step - eta * min(t_step, attention_s / 4)) + t_gather, rel=1e-12)
    fwd, _ = exposed_s((step,), profile=profile, group=group, attention_fwd_s=100.0, attention_bwd_s=0.0, efficiency=1)
    assert fwd == 0.0  # fully hidden under a long block at eta = 1


# ---- attention's work per rank --------------------------------------------------------------
def _causal_pairs(queries: list[int]) -> int:
    return sum(i + 1 for i in queries)


@pytest.mark.parametrize("n", [2, 3, 4, 8])
def test_the_busiest_rank_share_counts_causal_query_key_pairs(n):
    """Head-tail chunks (r, 2n-1-r) give every rank 1/n of the causal pairs; contiguous chunks give the last
    (2n-1)/n^2 (up to the diagonal's c/2 per chunk, vanishing as c grows)."""
    c = 64  # tokens per chunk of 2n
    total = _causal_pairs(list(range(2 * n * c)))
    head_tail = [
        _causal_pairs([*range(r * c, (r + 1) * c), *range((2 * n - 1 - r) * c, (2 * n - r) * c)]) for r in range(n)
    ]
    assert max(head_tail) == min(head_tail)
    assert max(head_tail) / total == pytest.approx(busiest_share(n, causal=True), rel=1e-2)
    contiguous = [_causal_pairs(list(range(r * 2 * c, (r + 1) * 2 * c))) for r in range(n)]
    assert max(contiguous) / total == pytest.approx(busiest_share(n, causal=True, balanced=False), rel=2e-2)
    assert busiest_share(n, causal=False, balanced=False) == 1 / n


@pytest.mark.parametrize("n", [2, 4])
def test_executed_flops_count_the_rectangles_the_kernels_run(n):
    """The all-gather path: chunk j's c queries against keys 0..(j+1)c; torch's ring: the local 2c x 2c
    block, then n-1 blocks of 2c x c; both over the S x S rectangle the trace counts."""
    c, r = 16, 1
    rect = (2 * n * c) ** 2
    allgather = sum(c * (j + 1) * c for j in (r, 2 * n - 1 - r))
    assert allgather / rect == executed_fraction(n, causal=True, variant="allgather")
    ring = (2 * c) ** 2 + (n - 1) * 2 * c * c
    assert ring / rect == executed_fraction(n, causal=True, variant="ring")
    assert executed_fraction(n, causal=False, variant="allgather") == 1 / n


# ---- CostModel --------------------------------------------------------------------------------
def test_a_cp_plan_is_priced_with_its_exposed_kv_time_and_audit_bytes(gqa, gqa_model):
    """cp = 2 allgather: per micro-batch and layer one all-gather and one reduce-scatter of 2K; the
    audit counts them (the forward's twice under full recomputation) under dim cp."""
    k = KV_HEADS * SEQ * HEAD_DIM * 2
    for recompute, forward_runs in (("none", 1), ("full", 2)):
        plan = _plan(cp=2, recompute=recompute)
        cost = gqa_model.estimate(plan)
        assert cost.cp_comm_s > 0 and cost.step_time_s == pytest.approx(sum(getattr(cost, f) for f in cost.TIME_FIELDS))
        (stage,) = predict_volumes(gqa_model, plan)
        m, layers = plan.num_microbatches, 2
        assert stage.comm[("cp", "all_gather")] == [forward_runs * m * layers, forward_runs * m * layers * 2 * k]
        assert stage.comm[("cp", "reduce_scatter")] == [m * layers, m * layers * 2 * k]
    (ring,) = predict_volumes(gqa_model, _plan(cp=2, cp_variant="ring"))
    assert ring.comm[("cp", "send")] == ring.comm[("cp", "recv")]
    assert ring.comm[("cp", "send")][0] == 2 * 2 * (1 + 1 + 2)  # m * layers * (fwd K,V + bwd K,V + bwd dK,dV)


def test_gradients_sync_over_dp_times_cp(gqa_model):
    """cp ranks hold the same weights: at dp = 1 cp = 2 gradients are still reduced, over the dp x cp
    group; dp = 2 cp = 2 syncs and shards exactly as dp = 4 (the same four consecutive ranks at tp = 1)."""
    alone = gqa_model.estimate(_plan(cp=2))
    assert alone.dp_comm_s > 0
    (stage,) = predict_volumes(gqa_model, _plan(cp=2))
    assert stage.comm[("dp", "all_reduce")][1] > 0
    for zero in (0, 1, 3):
        mixed, flat = (_plan(dp=dp, cp=cp, zero_stage=zero) for dp, cp in ((2, 2), (4, 1)))
        a, b = gqa_model.estimate(mixed), gqa_model.estimate(flat)
        assert (a.dp_comm_s, a.optimizer_s) == (b.dp_comm_s, b.optimizer_s)
        assert (a.weights_bytes, a.grads_bytes, a.optimizer_bytes) == (
            b.weights_bytes,
            b.grads_bytes,
            b.optimizer_bytes,
        )
        (sent,), (same,) = predict_volumes(gqa_model, mixed), predict_volumes(gqa_model, flat)
        assert {k: v for k, v in sent.comm.items() if k[0] == "dp"} == {
            k: v for k, v in same.comm.items() if k[0] == "dp"
        }
        assert sent.param_elements == same.param_elements


def test_a_plan_cp_cannot_split_is_one_sentence(gqa_model):
    with pytest.raises(PlanError, match="heads over cp=4"):
        gqa_model.estimate(_plan(cp=4, cp_variant="ulysses"))  # 2 KV heads
    gqa_model.estimate(_plan(cp=2, cp_variant="ulysses"))
    with pytest.raises(PlanError, match="do not divide that way"):
        gqa_model.estimate(_plan(cp=3))  # 1,024 tokens in 6 chunks


def test_the_compute_floor_stays_below_every_priced_cp_plan(gqa, gqa_model):
    bounds = Bounds(gqa, gqa_model.profile, StageCosts(gqa, gqa_model.profile, gqa_model))
    for variant in ("allgather", "ring", "ulysses"):
        for tp, cp, dp in ((1, 2, 1), (2, 2, 2), (1, 2, 4), (2, 2, 1)):
            if variant == "ulysses" and tp > 1:
                continue  # 2 KV heads: one per tp rank, which Ulysses cannot split
            plan = _plan(tp=tp, cp=cp, dp=dp, cp_variant=variant, recompute="none")
            cost = gqa_model.estimate(plan)
            floor = bounds.compute_min_s(tp=tp, precision="bf16", mbs=1, cp=cp, cp_variant=variant, dp=dp, pp=1)
            assert 0 < plan.num_microbatches * floor <= (cost.compute_s + cost.tp_comm_s + cost.cp_comm_s) * (1 + 1e-12)
    assert bounds.compute_min_s(tp=1, precision="bf16", mbs=1, cp=2) < bounds.compute_min_s(
        tp=1, precision="bf16", mbs=1
    )
    # at 2,048 tokens a ring step hides behind its causal block (the kernel runs ~half the rectangle; at
    # 1,024 it no longer does): the exposed all-gather is in the floor, the hidden ring steps not
    longer = synthetic_gpt(
        layers=2, hidden=HIDDEN, heads=HEADS, kv_heads=KV_HEADS, vocab=1024, seq=2 * SEQ, batch=BATCH
    )
    model = CostModel(longer, gqa_model.profile)
    bounds = Bounds(longer, model.profile, StageCosts(longer, model.profile, model))
    floors = {v: bounds.compute_min_s(tp=1, precision="bf16", mbs=1, cp=2, cp_variant=v) for v in ("ring", "allgather")}
    assert floors["allgather"] > floors["ring"]


@pytest.mark.parametrize("runtime", ["autoplan", "megatron"])
def test_the_accumulation_floor_stays_below_the_priced_cp_plan_under_each_runtime(gqa, gqa_model, runtime):
    bounds = Bounds(gqa, gqa_model.profile, StageCosts(gqa, gqa_model.profile, gqa_model))
    plan = _plan(cp=2, dp=2, num_microbatches=4, runtime=runtime)
    priced = gqa_model.estimate(plan).grad_accum_s
    assert bounds.accumulate_s(plan) <= priced * (1 + 1e-12)
    assert (priced > 0) == (runtime == "autoplan")  # Megatron fuses it into the weight-gradient GEMM


def test_llama2_7b_at_128k_tokens_holds_one_cp_th_of_the_activations(llama7b):
    """On dgx-h100, tp = 8: the ring keeps only the local K,V shards, so activations fall by cp (within the
    outside nodes' rounding); allgather holds the gathered K,V besides, 2K (1 - 1/cp) per layer."""
    base = dict(tp=8, micro_batch_size=1, num_microbatches=1, recompute="none", sequence_parallel=True)
    one = llama7b.estimate(_plan(**base))
    k = 1 * (32 // 8) * 131072 * 128 * 2
    for cp in (2, 4, 8):
        ring = llama7b.estimate(_plan(cp=cp, cp_variant="ring", **base))
        gathered = llama7b.estimate(_plan(cp=cp, **base))
        assert one.activations_bytes / ring.activations_bytes == pytest.approx(cp, rel=1e-3)
        extra = gathered.activations_bytes - ring.activations_bytes
        assert extra == pytest.approx(32 * 2 * k * (1 - 1 / cp), rel=1e-6)
        assert ring.peak_memory_bytes < gathered.peak_memory_bytes < one.peak_memory_bytes
        assert ring.compute_s == pytest.approx(one.compute_s / cp, rel=0.05)  # 1/cp of the tokens each
    assert not one.feasible and ring.feasible  # 155 GiB a device at cp = 1, 27 GiB at cp = 8


def test_cp_one_prices_as_before(gqa_model):
    """cp = 1 changes no field: the variant is ignored and no cp term appears (same_numbers.sh holds the rest)."""
    plan = _plan(dp=2, zero_stage=1)
    a, b = gqa_model.estimate(plan), gqa_model.estimate(replace(plan, cp_variant="ring"))
    assert a.to_dict() == b.to_dict() and a.cp_comm_s == 0.0
    assert (
        mesh_groups(gqa_model.profile, dp=2, tp=1, pp=1)["dp_cp"]
        == mesh_groups(gqa_model.profile, dp=2, tp=1, pp=1)["dp"]
    )
    assert not any(dim == "cp" for dim, _ in predict_volumes(gqa_model, plan)[0].comm)


def test_the_cp_group_has_stride_tp_and_spans_nodes_past_a_node():
    profile = synthetic_profile(devices_per_node=8)
    assert mesh_groups(profile, dp=1, tp=4, pp=1, cp=2)["cp"] == AxisGroup(size=2, ranks_per_node=2)
    assert mesh_groups(profile, dp=1, tp=8, pp=1, cp=2)["cp"] == AxisGroup(size=2, ranks_per_node=1)
    assert mesh_groups(profile, dp=2, tp=4, pp=1, cp=2)["dp_cp"] == AxisGroup(size=4, ranks_per_node=2)


@pytest.mark.parametrize("variant", ["allgather", "ring"])
def test_ops_csv_rows_sum_to_the_cp_plans_price(gqa, gqa_model, variant):
    """ops.csv charges each attention its exposed K,V time and gathered K,V, so a block's rows still sum
    to CostModel's step terms (pp = 1: every op runs m times on the one stage)."""
    plan = _plan(cp=2, cp_variant=variant)
    rows, cost = priced_ops(gqa, gqa_model.profile, plan), gqa_model.estimate(plan)
    m = plan.num_microbatches
    assert m * sum(r.compute_s for r in rows) == pytest.approx(cost.compute_s, rel=1e-9)
    assert m * sum(r.comm_s for r in rows) == pytest.approx(cost.tp_comm_s + cost.cp_comm_s, rel=1e-9)
    assert sum(r.activation_bytes for r in rows) == pytest.approx(cost.activations_bytes, abs=len(rows))


@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
def test_the_pipeline_partition_charges_a_block_its_cp_time(gqa_model, recompute):
    """block_time_s, what the partition balances, sums to the priced step terms of a one-stage cp plan."""
    plan = _plan(cp=2, recompute=recompute)
    cost, ctx = gqa_model.estimate(plan), gqa_model.tp_context(plan)
    blocks = gqa_model.block_summaries({}, ctx, False)
    pre, post = gqa_model.outside_summaries({}, ctx, False)
    assert all(b.cp_fwd_s > 0 for b in blocks.values())
    charged = block_time_s(pre, "none") + sum(block_time_s(b, recompute) for b in blocks.values())
    charged += block_time_s(post, "none")
    assert plan.num_microbatches * charged == pytest.approx(cost.compute_s + cost.tp_comm_s + cost.cp_comm_s, rel=1e-12)


@pytest.mark.parametrize("variant", ["allgather", "ring"])
def test_the_block_ilp_prices_each_split_with_its_cp_terms(gqa, gqa_model, variant):
    """The intra-op ILP's objective and memory row equal CostModel's block under cp = 2 for every split
    combination: the K,V bytes an attention exchanges follow the heads its splits leave on a rank."""
    ctx = gqa_model.tp_context(_plan(tp=2, cp=2, cp_variant=variant))
    layer = gqa.layers[0]
    problem = price_block(gqa, layer, ctx=ctx, forward_repeats=2, activation_factor=ctx.batch_fraction)
    structure = block_structure(gqa, layer)
    seen = set()
    for combo in itertools.product(*(problem.legal[v] for v in problem.params)):
        splits = dict(zip(problem.params, combo))
        if not problem.respects_ties(splits):
            continue
        block = summarise(
            gqa, structure, layer=layer, tp_plan={gqa.node(v).module: s for v, s in splits.items()}, ctx=ctx
        )
        time_s, memory = problem.evaluate(splits)
        charged = (
            2 * block.fwd_s + block.bwd_s + 2 * block.tp_fwd_s + block.tp_bwd_s + 2 * block.cp_fwd_s + block.cp_bwd_s
        )
        assert time_s == pytest.approx(charged, rel=1e-9)
        assert memory == pytest.approx(block.saved_bytes, rel=1e-9)
        seen.add(round(block.cp_fwd_s + block.cp_bwd_s, 15))
    assert len(seen) > 1  # splits that shard attention's heads exchange fewer K,V bytes
