"""NodeTimes keys an op's times on what the op is (op_costs.priced_facts), not on its name: the same op of
identical blocks is priced once, every memoised answer equals the plain node_times_s, and each fact the key
holds, varied alone, gives the op a price of its own."""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest
from synthetic import synthetic_gpt, synthetic_profile

from autoplan.cost import CostModel, price_block
from autoplan.cost.compute import op_costs
from autoplan.cost.compute.dtypes import DtypePolicy, RunDtypes, dtypes_of, run_dtypes
from autoplan.cost.compute.fusion import fused_ops
from autoplan.cost.compute.op_costs import NodeTimes, held_bytes, node_times_s, priced_facts
from autoplan.cost.node_terms import block_terms
from autoplan.cost.pp.split_backward import weight_grad_held_bytes
from autoplan.cost.tp import split_prices
from autoplan.cost.tp.block import analyse_block
from autoplan.cost.tp.shards import pure_layouts_possible
from autoplan.cost.tp.split_prices import memory_budget
from autoplan.cost.tp.splits import legal_splits
from autoplan.types.plan import Plan

CONTEXTS = list(itertools.product(["bf16", "fp32"], [1 / 4, 1 / 2], [1, 2], [False, True], [None, "autocast", "cast"]))


@pytest.fixture(scope="module")
def graph():
    return synthetic_gpt(layers=3, hidden=256, heads=4, seq=128, batch=4)


def _dtypes(graph, which: str | None) -> RunDtypes | None:
    if which is None:
        return None
    return run_dtypes(graph, DtypePolicy(low="bfloat16", cast_params=which == "cast", device="cuda"))


def test_identical_blocks_ops_are_priced_once_and_as_the_plain_function(graph, monkeypatch):
    """Blocks 1 and 2 (both read a block's output) differ in their nodes' names, modules, layers and parameter
    names only: after block 1, block 2's ops compute nothing new, in every context; each answer is node_times_s's."""
    profile = synthetic_profile()
    times, computed, plain = NodeTimes(graph, profile), [], op_costs.node_times_s
    monkeypatch.setattr(op_costs, "node_times_s", lambda *a, **k: computed.append(1) or plain(*a, **k))
    second, third = ([n for n in graph.nodes if n.layer == layer] for layer in graph.layers[1:])
    assert len(second) == len(third) > 10
    for precision, f, shard, fused, which in CONTEXTS:
        kw = dict(precision=precision, batch_fraction=f, shard=shard, fused=fused, dtypes=_dtypes(graph, which))
        for node in second:
            assert times(node, profile, **kw) == node_times_s(graph, node, profile, **kw)
        computed.clear()
        for node in third:
            assert times(node, profile, **kw) == node_times_s(graph, node, profile, **kw)
        assert computed == [], kw  # every answer for block 2 was block 1's (the plain calls above bypass the patch)


@pytest.mark.parametrize("fused", [False, True])
def test_dtype_policies_that_agree_on_a_node_share_its_times(graph, monkeypatch, fused):
    """The times read a policy only through the node's run dtype and its fused inputs' (its kind) and the bytes it
    reads (its key): under autocast without and with cast weights, a node that agrees on them is priced once, one
    that does not is priced anew, and every answer is node_times_s's under its own policy."""
    profile = synthetic_profile()
    times, computed, plain = NodeTimes(graph, profile), [], op_costs.node_times_s
    monkeypatch.setattr(op_costs, "node_times_s", lambda *a, **k: computed.append(1) or plain(*a, **k))
    policies = [_dtypes(graph, which) for which in ("autocast", "cast")]
    kw = dict(precision="bf16", batch_fraction=1 / 2, shard=1, fused=fused)
    agree = set()
    for node in graph.nodes:
        facts = [
            (times.kind(node, dtypes=d, fused=fused), times.reads(node, precision="bf16", dtypes=d)) for d in policies
        ]
        if facts[0] == facts[1]:
            agree.add(node.name)
    assert 10 < len(agree) < len(graph.nodes)  # the policies differ in some nodes' dtypes (the stream, cast weights)
    for dtypes in policies:
        computed.clear()
        for node in sorted(graph.nodes, key=lambda n: n.name not in agree):  # those that agree first
            assert times(node, profile, dtypes=dtypes, **kw) == plain(graph, node, profile, dtypes=dtypes, **kw)
            if dtypes is policies[1] and node.name in agree:
                assert computed == [], node.name  # the first policy's times
    assert computed  # those that do not agree: priced under the second policy


def test_each_fact_the_key_holds_gives_its_own_price(graph, monkeypatch):
    """A node that differs from another only in a field that names it shares its kind; one that differs in an
    own field, in needing a gradient, in its run dtype or in a fused input's run dtype does not, and its
    memoised times are node_times_s's of it, not the other's."""
    profile = synthetic_profile()
    linear = next(n for n in graph.nodes if n.layer == graph.layers[1] and n.op == "linear")
    times = NodeTimes(graph, profile)
    kw = dict(precision="bf16", batch_fraction=1 / 4, shard=1)
    twin = graph.node(linear.name.replace(".1.", ".2.", 1))  # block 2's: other names, module, layer, params
    assert (twin.module, twin.layer, twin.param_names) != (linear.module, linear.layer, linear.param_names)
    assert times.kind(twin, dtypes=None, fused=False) == times.kind(linear, dtypes=None, fused=False)
    base = times(linear, profile, **kw)
    for field, value in [("fwd_flops", linear.fwd_flops * 3), ("output_bytes", linear.output_bytes * 1000)]:
        other = replace(linear, **{field: value})
        assert times(other, profile, **kw) == node_times_s(graph, other, profile, **kw) != base, field
    facts = priced_facts(graph, linear, dtypes=None, fused=False)
    monkeypatch.setattr(graph, "grad_nodes", lambda: frozenset())
    assert priced_facts(graph, linear, dtypes=None, fused=False) != facts  # the backward's launch overhead
    monkeypatch.undo()
    dtypes = _dtypes(graph, "autocast")
    changed = RunDtypes.__new__(RunDtypes)
    changed.__dict__.update(dtypes.__dict__, dtypes={**dtypes.dtypes, linear.name: "float32"})
    assert priced_facts(graph, linear, dtypes=changed, fused=False) != priced_facts(
        graph, linear, dtypes=dtypes, fused=False
    )
    ops = fused_ops(graph)
    member = next(n for n in graph.nodes if n.layer == graph.layers[1] and n.name in ops and ops[n.name].reads)
    read = ops[member.name].reads[0]
    assert dtypes.dtypes[read] != "float16"  # bf16 or fp32 under a bf16 autocast
    changed.__dict__.update(dtypes={**dtypes.dtypes, read: "float16"})
    kinds = (priced_facts(graph, member, dtypes=d, fused=True) for d in (dtypes, changed))
    assert next(kinds) != next(kinds)


def test_the_memory_row_prices_through_the_memo(graph, monkeypatch):
    """The ILP's memory row for the outside nodes (split_prices.memory_budget) is the plain computation's with the
    search's NodeTimes: a second memory row as the first computes nothing."""
    profile = synthetic_profile()
    plan = Plan(devices=2, dp=1, tp=2, pp=1, micro_batch_size=2, num_microbatches=2, precision="bf16", compile=True)
    model = CostModel(graph, profile)
    cost = model.estimate(plan)
    plain = memory_budget(graph, profile, plan=plan, cost=cost)
    computed, real = [], op_costs.node_times_s
    monkeypatch.setattr(op_costs, "node_times_s", lambda *a, **k: computed.append(1) or real(*a, **k))
    assert memory_budget(graph, profile, plan=plan, cost=cost, node_times=model.node_times) == plain
    computed.clear()
    assert memory_budget(graph, profile, plan=plan, cost=cost, node_times=model.node_times) == plain
    assert computed == []


def test_a_nodes_held_bytes_are_kept_across_contexts(graph, monkeypatch):
    """op_costs.held_bytes, which node_terms and price_block read: a node's saved and weight-gradient bytes read
    no shard or micro-batch, so a block's terms in a second context compute none of them again, and every kept
    answer is the plain functions'."""
    profile = synthetic_profile()
    model = CostModel(graph, profile)
    layer = graph.layers[1]
    nodes = tuple(n for n in graph.nodes if n.layer == layer)
    counted, real = [], op_costs.saved_activation_bytes
    monkeypatch.setattr(op_costs, "saved_activation_bytes", lambda *a, **k: counted.append(1) or real(*a, **k))
    for mbs, tp, precision in itertools.product([1, 2], [1, 2], ["bf16", "fp32"]):
        plan = Plan(devices=tp, dp=1, tp=tp, pp=1, micro_batch_size=mbs, num_microbatches=1, precision=precision)
        ctx = model.tp_context(plan)
        counted.clear()
        block_terms(graph, nodes, layer=layer, tp_plan={}, ctx=ctx, node_times=model.node_times)
        price_block(graph, layer, ctx=ctx, activation_factor=1.0, node_times=model.node_times)
        assert len(counted) == (len(nodes) if (mbs, tp) == (1, 1) else 0), (mbs, tp, precision)
        dtypes = dtypes_of(graph, ctx.dtypes)
        for node in nodes:
            kw = dict(precision=precision, dtypes=dtypes)
            plain = (real(node, gpu=True, **kw), weight_grad_held_bytes(graph, node, **kw))
            assert held_bytes(graph, node, gpu=True, **kw) == plain


def test_a_pure_nodes_layouts_are_kept_across_contexts(monkeypatch):
    """price_block's pure nodes' sharding_origins read the block, tp and sequence parallelism, no micro-batch or
    precision: a second context at the same tp and sp computes none again, and each is the plain function's."""
    graph, profile = synthetic_gpt(layers=3, hidden=256, heads=4, seq=128, batch=4), synthetic_profile()
    model = CostModel(graph, profile)
    layer = graph.layers[1]
    block = analyse_block(graph, layer)
    counted, real = [], split_prices.sharding_origins
    monkeypatch.setattr(split_prices, "sharding_origins", lambda *a, **k: counted.append(1) or real(*a, **k))
    for sp, mbs, precision in itertools.product([False, True], [1, 2], ["bf16", "fp32"]):
        plan = Plan(devices=2, dp=1, tp=2, pp=1, micro_batch_size=mbs, num_microbatches=1, precision=precision)
        ctx = model.tp_context(replace(plan, sequence_parallel=sp))
        counted.clear()
        prices = price_block(graph, layer, ctx=ctx, activation_factor=1.0, node_times=model.node_times)
        assert prices.pure and len(counted) == (len(prices.pure) if (mbs, precision) == (1, "bf16") else 0)
        legal = {v: legal_splits(graph.node(v), 2) for v in block.params}
        for name, pure in prices.pure.items():
            plain = real(block, block.origins[name], legal, sequence_parallel=sp)
            assert pure.sharding == plain and tuple(pure.time_s) == pure_layouts_possible(
                block, block.origins[name], legal, sequence_parallel=sp
            )
