"""The tensor-parallel model of a block: legality, Megatron's comm volumes, shard factors."""

import pytest
from synthetic import synthetic_gpt, synthetic_profile

from autoplan.cost.network.comm import collective_time_s
from autoplan.cost.network.mesh import mesh_groups
from autoplan.cost.tp.default import default_tp_plan
from autoplan.cost.tp.splits import TPContext, legal_splits, node_splits, tp_layer_cost
from autoplan.errors import PlanError
from autoplan.types.graph import OpNode

HIDDEN, SEQ, BATCH = 512, 256, 8


def _ctx(profile, tp, *, sp=False, precision="bf16", mbs=1):
    group = mesh_groups(profile, dp=1, tp=tp, pp=1)["tp"]
    return TPContext(
        profile=profile, tp=tp, group=group, sequence_parallel=sp, precision=precision, batch_fraction=mbs / BATCH
    )


def _linear(out_features, in_features=64, **attrs):
    return OpNode(
        name="l",
        op="linear",
        target="linear",
        module="l",
        layer="h.0",
        output_shape=[2, 16, out_features],
        attrs={"in_features": in_features, "out_features": out_features, **attrs},
    )


def test_tp_one_only_replicates():
    assert legal_splits(_linear(64), 1) == ("replicate",)


def test_heads_that_do_not_divide_tp_forbid_colwise_on_q():
    q = _linear(96, attention={"roles": ["q"], "num_heads": 6, "num_kv_heads": 6, "head_dim": 16})
    assert "colwise" in legal_splits(q, 2)
    assert "colwise" not in legal_splits(q, 4)  # 6 heads over 4 ranks would cut a head
    assert "rowwise" in legal_splits(q, 4)  # its input features still divide


def test_gqa_kv_heads_limit_k_and_v_but_not_q():
    att = {"num_heads": 8, "num_kv_heads": 2, "head_dim": 16}
    q = _linear(128, attention={"roles": ["q"], **att})
    k = _linear(32, attention={"roles": ["k"], **att})
    assert "colwise" in legal_splits(q, 4)
    assert "colwise" not in legal_splits(k, 4)
    assert "colwise" in legal_splits(k, 2)


def test_embedding_norm_and_conv_splits():
    emb = OpNode(
        name="e",
        op="embedding",
        target="e",
        module="e",
        layer=None,
        output_shape=[2, 16, 64],
        attrs={"num_embeddings": 1000, "embedding_dim": 64},
    )
    assert set(legal_splits(emb, 4)) == {"replicate", "colwise", "rowwise"}
    assert set(legal_splits(emb, 16)) == {"replicate", "colwise"}  # 1000 % 16 != 0
    norm = OpNode(name="n", op="norm", target="n", module="n", layer="h.0", output_shape=[2, 16, 64])
    assert legal_splits(norm, 4) == ("replicate", "sequence_parallel")
    assert legal_splits(norm, 32) == ("replicate",)  # seq 16 % 32 != 0
    conv = OpNode(name="c", op="conv", target="c", module="c", layer="h.0", output_shape=[2, 8, 4, 4])
    assert legal_splits(conv, 2) == ("replicate",)


def test_default_plan_is_megatron():
    graph = synthetic_gpt(layers=2, hidden=HIDDEN, seq=SEQ, batch=BATCH)
    plan = default_tp_plan(graph, 4)
    for layer in graph.layers:
        assert [plan[f"{layer}.attn.{p}"] for p in "qkv"] == ["colwise"] * 3
        assert plan[f"{layer}.attn.o"] == "rowwise"
        assert (plan[f"{layer}.mlp.fc1"], plan[f"{layer}.mlp.fc2"]) == ("colwise", "rowwise")
    assert plan["wte"] == "rowwise" and plan["head"] == "colwise"
    assert "h.0.ln_1" not in plan
    assert default_tp_plan(graph, 4, sequence_parallel=True)["h.0.ln_1"] == "sequence_parallel"


def test_megatron_block_does_two_all_reduces_each_way():
    """Shoeybi et al. 2019: one all-reduce of b*s*h after attention and one after the MLP,
    mirrored in the backward at the colwise inputs."""
    profile = synthetic_profile()
    graph = synthetic_gpt(layers=2, hidden=HIDDEN, seq=SEQ, batch=BATCH)
    ctx = _ctx(profile, 4)
    cost = tp_layer_cost(graph, "h.0", default_tp_plan(graph, 4), ctx=ctx)
    message = SEQ * HIDDEN * 2  # one sample, bf16
    expected = 2 * collective_time_s(profile, "all_reduce", message, group=ctx.group)
    assert cost.comm_fwd_s == pytest.approx(expected)
    assert cost.comm_bwd_s == pytest.approx(expected)


def test_sequence_parallel_turns_all_reduces_into_gather_and_scatter():
    profile = synthetic_profile()
    graph = synthetic_gpt(layers=2, hidden=HIDDEN, seq=SEQ, batch=BATCH)
    ctx = _ctx(profile, 4, sp=True)
    cost = tp_layer_cost(graph, "h.0", default_tp_plan(graph, 4, sequence_parallel=True), ctx=ctx)
    message = SEQ * HIDDEN * 2
    gather = collective_time_s(profile, "all_gather", message, group=ctx.group)
    scatter = collective_time_s(profile, "reduce_scatter", message, group=ctx.group)
    assert cost.comm_fwd_s == pytest.approx(2 * gather + 2 * scatter)
    assert cost.comm_bwd_s == pytest.approx(2 * gather + 2 * scatter)
    assert cost.compute_shard["h.0.ln_1"] == 4 and cost.compute_shard["h.0.add_2"] == 4


def test_shards_follow_the_splits():
    profile = synthetic_profile()
    graph = synthetic_gpt(layers=2, hidden=HIDDEN, seq=SEQ, batch=BATCH)
    cost = tp_layer_cost(graph, "h.0", default_tp_plan(graph, 4), ctx=_ctx(profile, 4))
    assert cost.compute_shard["h.0.attn.sdpa"] == 4 and cost.compute_shard["h.0.mlp.gelu"] == 4
    assert cost.compute_shard["h.0.ln_1"] == 1 and cost.compute_shard["h.0.add_1"] == 1
    assert cost.param_shard["h.0.attn.q"] == 4
    # saved bytes are charged to the producing node (the tracer's rule): the colwise output is the
    # shard; the rowwise output is whole after its all-reduce
    assert cost.activation_shard["h.0.attn.q"] == 4 and cost.activation_shard["h.0.attn.o"] == 1
    sp = tp_layer_cost(graph, "h.0", default_tp_plan(graph, 4, sequence_parallel=True), ctx=_ctx(profile, 4, sp=True))
    assert sp.activation_shard["h.0.attn.o"] == 4 and sp.activation_shard["h.0.add_1"] == 4
    # a replicated k beside colwise q and v: DTensor slices k locally and runs attention head-sharded
    mixed = dict(default_tp_plan(graph, 4), **{"h.0.attn.k": "replicate"})
    assert tp_layer_cost(graph, "h.0", mixed, ctx=_ctx(profile, 4)).compute_shard["h.0.attn.sdpa"] == 4
    whole = dict(mixed, **{"h.0.attn.q": "replicate", "h.0.attn.v": "replicate"})
    assert tp_layer_cost(graph, "h.0", whole, ctx=_ctx(profile, 4)).compute_shard["h.0.attn.sdpa"] == 1


def test_replicated_block_needs_no_collective():
    graph = synthetic_gpt(layers=2, hidden=HIDDEN, seq=SEQ, batch=BATCH)
    cost = tp_layer_cost(graph, "h.0", {}, ctx=_ctx(synthetic_profile(), 4))
    assert (cost.comm_fwd_s, cost.comm_bwd_s) == (0.0, 0.0)
    assert set(cost.compute_shard.values()) == {1}


def test_fused_qkv_colwise_is_gathered_not_head_sharded():
    profile = synthetic_profile()
    graph = synthetic_gpt(layers=2, hidden=HIDDEN, seq=SEQ, batch=BATCH, fused_qkv=True)
    plan = default_tp_plan(graph, 4)
    assert plan["h.0.attn.qkv"] == "colwise"
    ctx = _ctx(profile, 4)
    cost = tp_layer_cost(graph, "h.0", plan, ctx=ctx)
    assert cost.compute_shard["h.0.attn.qkv"] == 4
    assert cost.compute_shard["h.0.attn.sdpa"] == 1  # attention sees gathered q, k, v
    gather = collective_time_s(profile, "all_gather", SEQ * 3 * HIDDEN * 2, group=ctx.group)
    unfused = tp_layer_cost(
        synthetic_gpt(layers=2, hidden=HIDDEN, seq=SEQ, batch=BATCH),
        "h.0",
        default_tp_plan(synthetic_gpt(layers=2, hidden=HIDDEN, seq=SEQ, batch=BATCH), 4),
        ctx=ctx,
    )
    assert cost.comm_fwd_s >= unfused.comm_fwd_s + gather * 0.99


def test_illegal_split_in_a_plan_is_one_sentence():
    graph = synthetic_gpt(layers=2, hidden=HIDDEN, heads=6, seq=SEQ, batch=BATCH, ffn=2048)
    with pytest.raises(PlanError, match="not legal at tp=4") as info:
        node_splits(graph, "h.0", {"h.0.attn.q": "colwise"}, tp=4)
    assert "\n" not in str(info.value)


# ---- head layouts read off the dataflow (real tracer) ----------------------------------------
import math  # noqa: E402

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from autoplan.trace import trace  # noqa: E402

B, S, A, D = 2, 16, 4, 8


class _Attention(torch.nn.Module):
    """One fused qkv linear h -> 3h in one of four layouts, then attention, then a rowwise-able proj."""

    def __init__(self, layout, heads=A):
        super().__init__()
        self.layout, self.heads = layout, heads
        self.qkv = torch.nn.Linear(heads * D, 3 * heads * D)
        self.proj = torch.nn.Linear(heads * D, heads * D)

    def forward(self, x):
        b, s, h = x.shape
        mixed = self.qkv(x)
        if self.layout in ("megatron_matmul", "megatron_sdpa"):  # head-interleaved [q_i | k_i | v_i]
            q, k, v = (t.transpose(1, 2) for t in mixed.view(b, s, self.heads, 3 * D).split(D, dim=-1))
        elif self.layout == "nanogpt":  # [q | k | v], then each viewed into heads
            q, k, v = (t.view(b, s, self.heads, D).transpose(1, 2) for t in mixed.split(h, dim=2))
        else:  # timm/ViT: (3, heads, head_dim)
            q, k, v = mixed.reshape(b, s, 3, self.heads, D).permute(2, 0, 3, 1, 4).unbind(0)
        if self.layout == "megatron_matmul":
            probs = torch.softmax(torch.matmul(q / math.sqrt(D), k.transpose(-2, -1)), dim=-1)
            out = torch.matmul(probs, v)
        else:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(out.transpose(1, 2).reshape(b, s, h))


class _Net(torch.nn.Module):
    def __init__(self, layout, heads=A):
        super().__init__()
        self.layers = torch.nn.ModuleList(_Attention(layout, heads) for _ in range(2))

    def forward(self, x):
        for layer in self.layers:
            x = x + layer(x)
        return x


def _traced(layout, heads=A):
    graph = trace(
        _Net(layout, heads),
        (torch.randn(B, S, heads * D),),
        loss_fn=lambda out, _: out.sum(),
        target=None,
        model_name=layout,
    )
    layer = graph.layers[0]
    qkv = next(n for n in graph.layer_nodes(layer) if n.module.endswith("qkv"))
    return graph, layer, qkv


@pytest.mark.parametrize("layout", ["megatron_matmul", "megatron_sdpa"])
def test_head_interleaved_qkv_is_head_sharded_without_a_gather(layout):
    # DTensor views a Shard(2) [b, s, 3h] as Shard on the heads of [b, s, a, 3d] and splits the
    # unsharded last dim locally: no collective, attention sharded (checked with CommDebugMode).
    graph, layer, qkv = _traced(layout)
    assert qkv.attrs["head_split"] == [A, 3 * D]
    assert "colwise" in legal_splits(qkv, 2) and "colwise" in legal_splits(qkv, 4)
    assert "colwise" not in legal_splits(qkv, 8)  # 4 heads over 8 ranks would cut heads
    profile = synthetic_profile()
    ctx = _traced_ctx(profile, 2)
    cost = tp_layer_cost(graph, layer, default_tp_plan(graph, 2), ctx=ctx)
    core = [n.name for n in graph.layer_nodes(layer) if n.op in ("matmul", "attention")]
    assert core and all(cost.compute_shard[n] == 2 for n in core)
    assert cost.activation_shard[qkv.name] == 2
    block_output = B * S * A * D * 2  # bf16
    assert cost.comm_fwd_s == pytest.approx(collective_time_s(profile, "all_reduce", block_output, group=ctx.group))
    # forward: only the proj's all-reduce (Megatron's g), nothing gathered


def _traced_ctx(profile, tp):
    return TPContext(
        profile=profile,
        tp=tp,
        group=mesh_groups(profile, dp=1, tp=tp, pp=1)["tp"],
        sequence_parallel=False,
        precision="bf16",
        batch_fraction=1.0,
    )


def test_split_then_viewed_qkv_is_gathered_and_leading_three_is_never_colwise():
    graph, layer, qkv = _traced("nanogpt")
    assert "colwise" in legal_splits(qkv, 2)
    cost = tp_layer_cost(graph, layer, default_tp_plan(graph, 2), ctx=_traced_ctx(synthetic_profile(), 2))
    attention = next(n.name for n in graph.layer_nodes(layer) if n.op == "attention")
    assert cost.compute_shard[qkv.name] == 2 and cost.compute_shard[attention] == 1
    assert cost.activation_shard[qkv.name] == 1  # consumers keep the gathered, whole output
    _, _, vit_qkv = _traced("vit")
    assert vit_qkv.attrs["head_split"] == [3, A, D]
    assert "colwise" not in legal_splits(vit_qkv, 2)  # DTensor cannot unflatten 3 over 2 ranks


def test_explicit_matmul_attention_gets_a_heads_check():
    _, _, qkv = _traced("megatron_matmul", heads=6)
    assert qkv.attrs["out_features"] % 4 == 0  # 144 features divide, 6 heads do not
    assert "colwise" in legal_splits(qkv, 2) and "colwise" not in legal_splits(qkv, 4)


# ---- Korthikanti et al. 2022 eq. (4)-(5) on the real Megatron graph ----------------------------
MS, MH, MA = 256, 256, 4


@pytest.fixture(scope="module")
def megatron_graphs():
    from pathlib import Path

    from autoplan.trace import trace_model_file

    root = Path(__file__).resolve().parents[3]
    graphs = {}
    with pytest.MonkeyPatch.context() as mp:
        for layers in (2, 4):
            for name, value in dict(N_LAYER=layers, N_EMBD=MH, N_HEAD=MA, SEQ_LEN=MS, VOCAB_SIZE=1024).items():
                mp.setenv(f"AUTOPLAN_GPTM_{name}", str(value))
            graphs[layers] = trace_model_file(root / "examples" / "gpt_megatron.py", 2)
    return graphs


def _per_layer_sbh(graphs, tp, *, sp, recompute):
    from autoplan.cost import CostModel
    from autoplan.types import Plan

    profile = synthetic_profile()  # backend nccl: 1-byte dropout masks, as on the A100s
    kept = []
    for layers in (2, 4):
        plan = Plan(
            devices=tp,
            dp=1,
            tp=tp,
            pp=1,
            micro_batch_size=1,
            num_microbatches=2,
            precision="bf16",
            recompute=recompute,
            sequence_parallel=sp,
            tp_plan=default_tp_plan(graphs[layers], tp, sequence_parallel=sp),
            runtime="megatron-lm-2022",  # every activation in 16 bits, as Korthikanti et al. count them
        )
        kept.append(CostModel(graphs[layers], profile).estimate(plan).activations_bytes)
    return (kept[1] - kept[0]) / 2 / (MS * MH)


@pytest.mark.parametrize("tp", [2, 4])
def test_megatron_activations_per_layer_follow_korthikanti_eq_4_and_5(megatron_graphs, tp):
    s2 = 5 * MA * MS / MH
    scores = 2 * MA * MS / MH
    # eq. (5), TP + SP: sbh/t (34 + 5as/h), plus the whole copies of the two gathered LayerNorm
    # outputs the executor's linears save, 2 x 2sbh (1 - 1/t), where Megatron gathers them again in
    # the backward (cost/tp/memory.py). Selective recomputation (cost/blocks.py) keeps the block
    # input and the matmul outputs: input 2, qkv 6, QK^T scores 2as/h, attention 2, proj 2, fc1 8, fc2 2
    assert _per_layer_sbh(megatron_graphs, tp, sp=True, recompute="none") == pytest.approx(
        (34 + s2) / tp + 4 * (1 - 1 / tp), rel=0.005
    )
    assert _per_layer_sbh(megatron_graphs, tp, sp=True, recompute="selective") == pytest.approx(
        (22 + scores) / tp, rel=0.005
    )
    # TP only: the input and the all-reduced fc2 and proj outputs (2 + 2 + 2) stay whole, the rest is /t
    assert _per_layer_sbh(megatron_graphs, tp, sp=False, recompute="selective") == pytest.approx(
        6 + (16 + scores) / tp, rel=0.005
    )


def test_every_saving_node_of_a_megatron_block_is_sharded_under_sp(megatron_graphs):
    graph = megatron_graphs[2]
    layer = graph.layers[0]
    ctx = _ctx(synthetic_profile(), 4, sp=True)
    cost = tp_layer_cost(graph, layer, default_tp_plan(graph, 4, sequence_parallel=True), ctx=ctx)
    whole = [n.name for n in graph.layer_nodes(layer) if n.saved_bytes and cost.activation_shard[n.name] != 4]
    assert whole == []
    # the dropout after a reduce-scattered rowwise linear runs on the sequence shard (compute too)
    dropouts = [n.name for n in graph.layer_nodes(layer) if "dropout" in n.target and n.output_shape[-1] == MH]
    assert dropouts and all(cost.compute_shard[d] == 4 for d in dropouts)
