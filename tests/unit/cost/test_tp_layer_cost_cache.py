"""tp_layer_cost is kept on the graph per the block's splits and block_terms' key (cost/tp/splits.py): a context that
differs only in what neither the terms nor the shards read (fusion, the FP8 recipe, the cp variant) shares the entry,
one that differs in what they read does not, and every entry equals the computation on a fresh graph."""

import dataclasses

from synthetic import synthetic_gpt, synthetic_profile

from autoplan.cost.compute.dtypes import DtypePolicy
from autoplan.cost.compute.fp8 import Fp8Recipe
from autoplan.cost.network.mesh import mesh_groups
from autoplan.cost.tp.default import default_tp_plan
from autoplan.cost.tp.splits import TPContext, tp_layer_cost

BATCH = 8
BF16 = DtypePolicy(low="bfloat16", cast_params=False, device="cuda")


def _graph():
    return synthetic_gpt(layers=2, hidden=256, seq=64, batch=BATCH)


def _ctx(profile, **fields):
    group = mesh_groups(profile, dp=1, tp=4, pp=1)["tp"]
    ctx = TPContext(
        profile=profile, tp=4, group=group, sequence_parallel=False, precision="bf16", batch_fraction=2 / BATCH
    )
    return dataclasses.replace(ctx, **fields)


def _fresh(layer, plan, ctx):
    """The plain computation: a new graph holds no cache."""
    return tp_layer_cost(_graph(), layer, plan, ctx=ctx)


def test_fields_no_term_reads_share_one_entry_equal_to_the_plain_cost():
    graph, profile = _graph(), synthetic_profile()
    plan = default_tp_plan(graph, 4)
    first = tp_layer_cost(graph, graph.layers[0], plan, ctx=_ctx(profile))
    for other in (dict(fused=True), dict(fp8=Fp8Recipe("rowwise")), dict(cp_variant="ring")):
        ctx = _ctx(profile, **other)
        assert tp_layer_cost(graph, graph.layers[0], plan, ctx=ctx) is first
        assert _fresh(graph.layers[0], plan, ctx) == first


def test_fields_the_terms_or_shards_read_get_their_own_cost():
    graph, profile = _graph(), synthetic_profile()
    plan = default_tp_plan(graph, 4)
    layer = graph.layers[0]
    base = tp_layer_cost(graph, layer, plan, ctx=_ctx(profile))
    others = (dict(batch_fraction=4 / BATCH), dict(sequence_parallel=True), dict(dtypes=BF16))
    for other in others:
        ctx = _ctx(profile, **other)
        cost = tp_layer_cost(graph, layer, plan, ctx=ctx)
        assert cost == _fresh(layer, plan, ctx) and cost != base
    replicated = {module: "replicate" for module in plan}
    cost = tp_layer_cost(graph, layer, replicated, ctx=_ctx(profile))
    assert cost == _fresh(layer, replicated, _ctx(profile)) and cost.comm_fwd_s == 0.0 < base.comm_fwd_s
    assert tp_layer_cost(graph, None, plan, ctx=_ctx(profile)) == _fresh(None, plan, _ctx(profile))


def test_a_profile_with_other_links_gets_its_own_cost():
    graph = _graph()
    plan = default_tp_plan(graph, 4)
    fast, slow = synthetic_profile(intra_busbw_bytes_per_s=200e9), synthetic_profile(intra_busbw_bytes_per_s=2e9)
    fast_cost = tp_layer_cost(graph, graph.layers[0], plan, ctx=_ctx(fast))
    slow_cost = tp_layer_cost(graph, graph.layers[0], plan, ctx=_ctx(slow))
    assert slow_cost == _fresh(graph.layers[0], plan, _ctx(slow)) and slow_cost.comm_fwd_s > fast_cost.comm_fwd_s


def test_under_fp8_recipes_that_cast_before_or_after_the_redistributions_get_their_own_cost():
    """Tensorwise FP8 under SP: casting before the all-gather (torchtitan's float8 TP styles) all-reduces more
    amaxes than casting after it (cost/tp/amax.py); both recipes are named "tensorwise", and neither may take the
    other's cached terms or cost."""
    graph, profile = _graph(), synthetic_profile()
    plan = default_tp_plan(graph, 4)
    layer = graph.layers[0]
    after, first = (
        _ctx(profile, precision="fp8", sequence_parallel=True, fp8=Fp8Recipe("tensorwise", tp_cast_first=cast))
        for cast in (False, True)
    )
    cost_after = tp_layer_cost(graph, layer, plan, ctx=after)
    cost_first = tp_layer_cost(graph, layer, plan, ctx=first)
    assert cost_after == _fresh(layer, plan, after) and cost_first == _fresh(layer, plan, first)
    assert cost_first.comm_fwd_s > cost_after.comm_fwd_s
