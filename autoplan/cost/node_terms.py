"""Each node's share of a block summary, and their sums in the block's order (docs/cost-model.md, "Blocks").

:func:`autoplan.cost.blocks.summarise` adds, node by node, a node's forward and backward seconds, its
weight-gradient share, FLOPs, saved and kept bytes and so on (that module's docstring states each term).
A node's terms read the block's tp splits and the TP context, and the expert placement only through two
numbers: an expert GEMM's seconds (cost/moe/experts.py ``grouped_gemm_s``) and the busiest ep rank's rows
``i`` for the nodes of the routed experts. So :func:`block_terms` prices every node once per block, splits
and context without the placement (``TPContext.dense_key``, and whether there is one), and
:meth:`BlockTerms.sums` prices again only the routed experts' nodes under a placement, then adds every
column in the block's node order from 0.0, as the loop it replaces did: the sums are the same floats.
A search over ep, expert_tp and routing then re-prices an MoE block's few expert nodes per placement,
not its attention and shared experts (cost/summaries.py keeps the terms per context).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import reduce
from operator import add
from typing import NamedTuple

from autoplan.cost.compute.dtypes import RunDtypes, dtypes_of
from autoplan.cost.compute.fp8 import fp8_linear
from autoplan.cost.compute.op_costs import NodeTimes, held_bytes
from autoplan.cost.compute.roofline import activation_scale, executed_bwd_flops, fp8_cast_s, fp8_weight_cast_s
from autoplan.cost.cp.exposed import attention_time_factor, executed_fraction
from autoplan.cost.moe.experts import BlockExperts, grouped_gemm_s, layers_in
from autoplan.cost.pp.split_backward import weight_grad_flops, weight_grad_s
from autoplan.cost.tp.block import BlockAnalysis, analyse_block
from autoplan.cost.tp.memory import param_copy_bytes
from autoplan.cost.tp.splits import TPContext, TPLayerCost, node_splits, tp_layer_cost
from autoplan.types.graph import Graph, OpNode, within
from autoplan.types.moe import MoELayer
from autoplan.types.saved_ops import SAVED_KINDS


class NodeTerms(NamedTuple):
    """One node's share of each sum of :class:`~autoplan.cost.blocks.LayerSummary` (0.0 where it adds none)."""

    fwd_s: float
    bwd_s: float
    wgrad_s: float
    fp8_params: float
    tp_matmul_fwd_s: float
    tp_matmul_bwd_s: float
    tp_chunking_fwd_s: float
    tp_chunking_bwd_s: float
    flops: float
    wgrad_held_bytes: float
    saved_bytes: float
    loss_saved_bytes: float
    kept_bytes: float
    matmul_fwd_flops: float
    matmul_bwd_flops: float
    attention_fwd_flops: float
    attention_bwd_flops: float
    rerun_s: float
    expert_fwd_s: float  # of fwd_s, an expert GEMM's (grouped) seconds
    expert_bwd_s: float


ZERO = NodeTerms(*(0.0,) * len(NodeTerms._fields))  # where every sum starts, as the loop's ``x = 0.0``

#: an attention call under cp > 1: (node, tp shard, forward s, backward s), as cost/cp/block.py reads it
Attention = tuple[OpNode, int, float, float]


@dataclass
class BlockTerms:
    """Every node's terms of one block under one tp_plan and context, the expert placement left out
    (module docstring): ``routed`` are the positions of the routed experts' nodes, priced again per placement."""

    graph: Graph
    ctx: TPContext  # the context the terms were priced in: its placement is not read
    times: NodeTimes
    tp_cost: TPLayerCost
    dtypes: RunDtypes | None
    block: BlockAnalysis
    splits: dict[str, str]
    nodes: tuple[OpNode, ...]
    terms: list[NodeTerms]
    routed: tuple[int, ...]
    attention: list[Attention]  # the attention calls under cp > 1, none of them an expert GEMM
    facts: BlockFacts  # each node's node_facts: shared by the terms at every batch fraction
    _prefix: NodeTerms | None = None  # the sums of the nodes before the first routed one
    _by_busiest: dict[tuple[int, float], NodeTerms] = field(default_factory=dict)  # routed non-GEMMs' (_routed_terms)

    def sums(self, ctx: TPContext, experts: BlockExperts | None) -> NodeTerms:
        """Each column summed over the block's nodes in order from 0.0, the routed experts' nodes priced
        under ``ctx``'s placement (``experts``: cost/moe/experts.py ``block_experts`` of it). The sums of the
        nodes before the first routed one are kept, and the rest added to them: the same floats."""
        if not self.routed or experts is None:
            return _summed(self.terms, ZERO)
        first = self.routed[0]
        if self._prefix is None:
            self._prefix = _summed(self.terms[:first], ZERO)
        tail = self.terms[first:]
        for i in self.routed:
            tail[i - first] = self._routed_terms(i, ctx, experts)
        return _summed(tail, self._prefix)

    def _routed_terms(self, i: int, ctx: TPContext, experts: BlockExperts) -> NodeTerms:
        """Routed node ``i``'s terms under ``experts``; one that is not an expert GEMM kept per busiest share: with
        ``gemm`` None, :func:`node_terms` reads the placement only as ``busiest``, and the rest of ``ctx`` only
        through its ``dense_key``, which every context these terms serve shares (cost/summaries.py keys them so)."""
        node = self.nodes[i]
        gemm = experts.gemms.get(node.name)
        if gemm is not None:
            return node_terms(self, node, ctx=ctx, gemm=gemm, busiest=experts.imbalance, facts=self.facts.nodes[i])[0]
        hit = self._by_busiest.get((i, experts.imbalance))
        if hit is None:
            hit = node_terms(self, node, ctx=ctx, gemm=None, busiest=experts.imbalance, facts=self.facts.nodes[i])[0]
            self._by_busiest[i, experts.imbalance] = hit
        return hit


def _summed(terms: list[NodeTerms], start: NodeTerms) -> NodeTerms:
    """Each column of ``terms`` added in order to ``start``'s (``+=`` as a loop adds: no compensated sum)."""
    columns = list(zip(*terms)) or [()] * len(start)  # a block of no nodes: its sums are the start
    return NodeTerms(*(reduce(add, column, first) for column, first in zip(columns, start)))


def block_terms(
    graph: Graph,
    nodes: tuple[OpNode, ...],
    *,
    layer: str | None,
    tp_plan: dict[str, str],
    ctx: TPContext,
    node_times: NodeTimes | None = None,
    facts: BlockFacts | None = None,
) -> BlockTerms:
    """The terms of block ``layer``'s ``nodes`` under ``tp_plan`` and ``ctx``, the routed experts' nodes
    priced as if the placement kept every rank's rows at the mean (module docstring); ``facts``: the nodes'
    :func:`node_facts` under ``tp_plan`` and a context that differs from ``ctx`` at most in its batch fraction
    and expert placement (computed when None)."""
    modules = {m.experts_module for m in layers_in(graph, nodes)} if ctx.experts is not None else set()
    terms = BlockTerms(
        graph=graph,
        ctx=ctx,
        times=node_times or NodeTimes(graph, ctx.profile),
        tp_cost=tp_layer_cost(graph, layer, tp_plan, ctx=ctx),
        dtypes=dtypes_of(graph, ctx.dtypes),
        block=analyse_block(graph, layer),
        splits=node_splits(graph, layer, tp_plan, tp=ctx.tp),
        nodes=nodes,
        terms=[],
        routed=tuple(i for i, n in enumerate(nodes) if any(within(n.module, m) for m in modules)),
        attention=[],
        facts=facts if facts is not None else BlockFacts([]),
    )
    if facts is None:
        terms.facts.nodes.extend(node_facts(terms, node, ctx) for node in nodes)
    for node, nf in zip(nodes, terms.facts.nodes):
        one, attention = node_terms(terms, node, ctx=ctx, gemm=None, busiest=1.0, facts=nf)
        terms.terms.append(one)
        if attention is not None:
            terms.attention.append(attention)
    return terms


class NodeFacts(NamedTuple):
    """What :func:`node_terms` reads of a node that no batch fraction changes: its shards, reads and bytes under
    the block's splits and the context but its ``batch_fraction`` (:func:`node_facts`), each the same float the
    terms' formulas computed inline, so a block's terms at another micro-batch reuse them (cost/summaries.py)."""

    shard: int  # compute shard
    read: float  # its preds' outputs, traced batch
    fp8_params: float  # an FP8 linear's weight elements per device (0.0 else)
    overlaps: bool  # a split linear under tp > 1: priced as tp token slices too
    act_shard: int
    held_share: float  # held / act_shard (saved bytes, traced batch)
    saved_share: float  # held / act_shard + copies
    wgrad_held: float
    wgrad_flops: float  # split_backward.weight_grad_flops
    kept_share: float  # (out / act_shard + own_output) of a kept kind, else 0.0
    ran: float  # _executed_share
    bwd_executed_flops: float
    time_factor: float  # attention under cp > 1: attention_time_factor, else 1.0


@dataclass
class BlockFacts:
    """A block's :class:`NodeFacts` in its node order, and what cost/blocks.py ``summarise`` sums of the block
    that reads no batch fraction either, kept by it on first use: the loss's backward bytes per traced batch and
    the held parameters (``_params``; they read the nodes and the tp shards)."""

    nodes: list[NodeFacts]
    loss_grad_bytes: float | None = None
    params: tuple[dict[str, float], float] | None = None


def node_facts(bt: BlockTerms, node: OpNode, ctx: TPContext) -> NodeFacts:
    """``node``'s :class:`NodeFacts` under ``bt``'s splits and ``ctx``: they read its shards (tp, sequence parallel,
    splits), precision, run dtypes, fp8 recipe, cp degree and variant and the profile's backend, never the batch
    fraction nor the expert placement."""
    graph, precision, dtypes = bt.graph, ctx.precision, bt.dtypes
    shard = bt.tp_cost.compute_shard.get(node.name, 1)
    read = bt.times.reads(node, precision=precision, dtypes=dtypes)
    fp8 = 0.0
    if fp8_linear(node, precision=precision, shard=shard):
        fp8 = node.attrs["in_features"] * node.attrs["out_features"] / bt.tp_cost.param_shard.get(node.name, 1)
    split = bt.splits.get(node.name)
    overlaps = ctx.tp > 1 and node.op == "linear" and split in ("colwise", "rowwise")
    act_shard = bt.tp_cost.activation_shard.get(node.name, 1)
    kw = dict(precision=precision, dtypes=dtypes)
    copies = param_copy_bytes(graph, bt.block, node.name, split, tp=ctx.tp, **kw) if split is not None else 0.0
    held, wgrad_held = held_bytes(graph, node, gpu=ctx.profile.backend == "nccl", **kw)
    kept = 0.0
    if node.op in SAVED_KINDS:
        own_output = copies if split == "colwise" else 0.0  # a gathered colwise output's local shard
        kept = node.output_bytes * activation_scale(node, **kw) / act_shard + own_output
    factor = 1.0
    if ctx.cp > 1 and node.op == "attention":
        factor = attention_time_factor(ctx.cp, causal=bool(node.attrs.get("causal")))
    held_share = held / act_shard
    return NodeFacts(
        shard, read, fp8, overlaps, act_shard, held_share, held_share + copies, wgrad_held,
        weight_grad_flops(graph, node), kept, _executed_share(node, ctx), executed_bwd_flops(node), factor,
    )  # fmt: skip


def node_terms(
    bt: BlockTerms,
    node: OpNode,
    *,
    ctx: TPContext,
    gemm: MoELayer | None,
    busiest: float,
    facts: NodeFacts | None = None,
) -> tuple[NodeTerms, Attention | None]:
    """One node's terms (cost/blocks.py's docstring): ``gemm`` the MoE layer when the node is one of its
    expert GEMMs under a placement (priced as a grouped GEMM), ``busiest`` the busiest ep rank's rows over
    the mean for a node of the routed experts, else 1.0; with its attention call under cp > 1. ``facts``:
    its :func:`node_facts` under ``bt`` and ``ctx`` (computed when None)."""
    precision, f = ctx.precision, ctx.batch_fraction
    nf = node_facts(bt, node, ctx) if facts is None else facts
    shard = nf.shard
    if gemm is not None:
        kw = dict(precision=precision, batch_fraction=f, place=ctx.experts, recipe=ctx.fp8)
        t_fwd, t_bwd = grouped_gemm_s(node, gemm, ctx.profile, **kw)
    else:
        kw = dict(precision=precision, batch_fraction=f, shard=shard, reads=nf.read, recipe=ctx.fp8)
        t_fwd, t_bwd = bt.times(node, ctx.profile, fused=ctx.fused, dtypes=bt.dtypes, **kw)
    attention = None
    if ctx.cp > 1 and node.op == "attention":
        t_fwd, t_bwd = t_fwd * nf.time_factor, t_bwd * nf.time_factor
        attention = (node, shard, t_fwd, t_bwd)
    overlap = (0.0, 0.0, 0.0, 0.0)
    if nf.overlaps:
        overlap = _split_overlap(bt, node, ctx, shard=shard, read=nf.read, t_fwd=t_fwd, t_bwd=t_bwd)
    kept = rerun = 0.0
    flops = [0.0, 0.0, 0.0, 0.0]  # matmul fwd, bwd; attention fwd, bwd
    if node.op in SAVED_KINDS:
        kept = nf.kept_share * f * busiest
        at = 2 if node.op == "attention" else 0  # under cp, ran: the share of attention's rectangle a rank runs
        flops[at] = node.fwd_flops * f / shard * nf.ran
        flops[at + 1] = nf.bwd_executed_flops * f / shard * nf.ran  # the audit measures what runs
        # FP8's scaling passes are not kept (types/saved_ops.py): they re-run before the kept GEMM
        rerun = fp8_cast_s(
            node, ctx.profile, precision=precision, batch_fraction=f, shard=shard, backward=False, recipe=ctx.fp8
        )
    else:
        rerun = t_fwd
    one = NodeTerms(
        t_fwd,
        t_bwd,
        weight_grad_s(bt.graph, node, bwd_s=t_bwd, wgrad_flops=nf.wgrad_flops),
        nf.fp8_params if gemm is None else 0.0,
        *overlap,
        (node.fwd_flops + node.bwd_flops) * f / shard,
        nf.wgrad_held * f / nf.act_shard,
        nf.saved_share * f * busiest,
        nf.held_share * f if node.op == "loss" else 0.0,  # freed at a split backward's B
        kept,
        *flops,
        rerun,
        t_fwd if gemm is not None else 0.0,
        t_bwd if gemm is not None else 0.0,
    )
    return one, attention


def _executed_share(node: OpNode, ctx: TPContext) -> float:
    """1, or under context parallelism an attention's executed FLOPs over its 1/cp share
    (autoplan/cost/cp/exposed.py ``executed_fraction``)."""
    if ctx.cp == 1 or node.op != "attention":
        return 1.0
    return executed_fraction(ctx.cp, causal=bool(node.attrs.get("causal")), variant=ctx.cp_variant) * ctx.cp


def _split_overlap(
    bt: BlockTerms, node: OpNode, ctx: TPContext, *, shard: int, read: float, t_fwd: float, t_bwd: float
) -> tuple[float, float, float, float]:
    """A split linear's time, and what running it as tp slices of the tokens adds
    (autoplan/cost/tp/overlap.py): tp * t(1/tp of the tokens) - t(all of them), less the
    (tp - 1) extra casts of an FP8 weight that is cast once for all slices (slices priced unfused)."""
    n = ctx.tp
    kw = dict(precision=ctx.precision, shard=shard, recipe=ctx.fp8)
    recast = (n - 1) * fp8_weight_cast_s(node, ctx.profile, backward=False, **kw)
    recast_bwd = (n - 1) * fp8_weight_cast_s(node, ctx.profile, backward=True, **kw)
    f = ctx.batch_fraction / n
    slice_fwd, slice_bwd = bt.times(node, ctx.profile, batch_fraction=f, reads=read, dtypes=bt.dtypes, **kw)
    return t_fwd, t_bwd, max(0.0, n * slice_fwd - t_fwd - recast), max(0.0, n * slice_bwd - t_bwd - recast_bwd)
