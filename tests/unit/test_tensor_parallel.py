"""The tensor-parallel model of a block: legality, Megatron's comm volumes, shard factors."""
import pytest

from autoplan.cost.comm import collective_time_s
from autoplan.cost.mesh import mesh_groups
from autoplan.cost.tensor_parallel import TPContext, default_tp_plan, legal_splits, node_splits, tp_layer_cost
from autoplan.errors import PlanError
from autoplan.solve.synthetic import synthetic_gpt, synthetic_profile
from autoplan.types.graph import OpNode

HIDDEN, SEQ, BATCH = 512, 256, 8


def _ctx(profile, tp, *, sp=False, precision="bf16", mbs=1):
    group = mesh_groups(profile, dp=1, tp=tp, pp=1)["tp"]
    return TPContext(profile=profile, tp=tp, group=group, sequence_parallel=sp, precision=precision, batch_fraction=mbs / BATCH)


def _linear(out_features, in_features=64, **attrs):
    return OpNode(name="l", op="linear", target="linear", module="l", layer="h.0", output_shape=[2, 16, out_features],
                  attrs={"in_features": in_features, "out_features": out_features, **attrs})


def test_tp_one_only_replicates():
    assert legal_splits(_linear(64), 1) == ("replicate",)


def test_heads_that_do_not_divide_tp_forbid_colwise_on_q():
    q = _linear(96, attention={"roles": ["q"], "num_heads": 6, "num_kv_heads": 6, "head_dim": 16})
    assert "colwise" in legal_splits(q, 2)
    assert "colwise" not in legal_splits(q, 4)          # 6 heads over 4 ranks would cut a head
    assert "rowwise" in legal_splits(q, 4)              # its input features still divide


def test_gqa_kv_heads_limit_k_and_v_but_not_q():
    att = {"num_heads": 8, "num_kv_heads": 2, "head_dim": 16}
    q = _linear(128, attention={"roles": ["q"], **att})
    k = _linear(32, attention={"roles": ["k"], **att})
    assert "colwise" in legal_splits(q, 4)
    assert "colwise" not in legal_splits(k, 4)
    assert "colwise" in legal_splits(k, 2)


def test_embedding_norm_and_conv_splits():
    emb = OpNode(name="e", op="embedding", target="e", module="e", layer=None, output_shape=[2, 16, 64],
                 attrs={"num_embeddings": 1000, "embedding_dim": 64})
    assert set(legal_splits(emb, 4)) == {"replicate", "colwise", "rowwise"}
    assert set(legal_splits(emb, 16)) == {"replicate", "colwise"}          # 1000 % 16 != 0
    norm = OpNode(name="n", op="norm", target="n", module="n", layer="h.0", output_shape=[2, 16, 64])
    assert legal_splits(norm, 4) == ("replicate", "sequence_parallel")
    assert legal_splits(norm, 32) == ("replicate",)                         # seq 16 % 32 != 0
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
    mixed = dict(default_tp_plan(graph, 4), **{"h.0.attn.k": "replicate"})
    assert tp_layer_cost(graph, "h.0", mixed, ctx=_ctx(profile, 4)).compute_shard["h.0.attn.sdpa"] == 1


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
    assert cost.compute_shard["h.0.attn.sdpa"] == 1           # attention sees gathered q, k, v
    gather = collective_time_s(profile, "all_gather", SEQ * 3 * HIDDEN * 2, group=ctx.group)
    unfused = tp_layer_cost(synthetic_gpt(layers=2, hidden=HIDDEN, seq=SEQ, batch=BATCH), "h.0",
                            default_tp_plan(synthetic_gpt(layers=2, hidden=HIDDEN, seq=SEQ, batch=BATCH), 4), ctx=ctx)
    assert cost.comm_fwd_s >= unfused.comm_fwd_s + gather * 0.99


def test_illegal_split_in_a_plan_is_one_sentence():
    graph = synthetic_gpt(layers=2, hidden=HIDDEN, heads=6, seq=SEQ, batch=BATCH, ffn=2048)
    with pytest.raises(PlanError, match="not legal at tp=4") as info:
        node_splits(graph, "h.0", {"h.0.attn.q": "colwise"}, tp=4)
    assert "\n" not in str(info.value)
