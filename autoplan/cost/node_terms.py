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
from autoplan.cost.pp.split_backward import weight_grad_s
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
            return node_terms(self, node, ctx=ctx, gemm=gemm, busiest=experts.imbalance)[0]
        hit = self._by_busiest.get((i, experts.imbalance))
        if hit is None:
            hit = node_terms(self, node, ctx=ctx, gemm=None, busiest=experts.imbalance)[0]
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
) -> BlockTerms:
    """The terms of block ``layer``'s ``nodes`` under ``tp_plan`` and ``ctx``, the routed experts' nodes
    priced as if the placement kept every rank's rows at the mean (module docstring)."""
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
    )
    for node in nodes:
        one, attention = node_terms(terms, node, ctx=ctx, gemm=None, busiest=1.0)
        terms.terms.append(one)
        if attention is not None:
            terms.attention.append(attention)
    return terms


def node_terms(
    bt: BlockTerms, node: OpNode, *, ctx: TPContext, gemm: MoELayer | None, busiest: float
) -> tuple[NodeTerms, Attention | None]:
    """One node's terms (cost/blocks.py's docstring): ``gemm`` the MoE layer when the node is one of its
    expert GEMMs under a placement (priced as a grouped GEMM), ``busiest`` the busiest ep rank's rows over
    the mean for a node of the routed experts, else 1.0; with its attention call under cp > 1."""
    graph, precision, f, dtypes = bt.graph, ctx.precision, ctx.batch_fraction, bt.dtypes
    shard = bt.tp_cost.compute_shard.get(node.name, 1)
    read = bt.times.reads(node, precision=precision, dtypes=dtypes)  # its preds' outputs
    if gemm is not None:
        kw = dict(precision=precision, batch_fraction=f, place=ctx.experts, recipe=ctx.fp8)
        t_fwd, t_bwd = grouped_gemm_s(node, gemm, ctx.profile, **kw)
    else:
        kw = dict(precision=precision, batch_fraction=f, shard=shard, reads=read, recipe=ctx.fp8)
        t_fwd, t_bwd = bt.times(node, ctx.profile, fused=ctx.fused, dtypes=dtypes, **kw)
    attention = None
    if ctx.cp > 1 and node.op == "attention":
        factor = attention_time_factor(ctx.cp, causal=bool(node.attrs.get("causal")))
        t_fwd, t_bwd = t_fwd * factor, t_bwd * factor
        attention = (node, shard, t_fwd, t_bwd)
    fp8 = 0.0
    if fp8_linear(node, precision=precision, shard=shard) and gemm is None:
        fp8 = node.attrs["in_features"] * node.attrs["out_features"] / bt.tp_cost.param_shard.get(node.name, 1)
    overlap = (0.0, 0.0, 0.0, 0.0)
    if ctx.tp > 1 and node.op == "linear" and bt.splits.get(node.name) in ("colwise", "rowwise"):
        overlap = _split_overlap(bt, node, ctx, shard=shard, read=read, t_fwd=t_fwd, t_bwd=t_bwd)
    act_shard = bt.tp_cost.activation_shard.get(node.name, 1)
    split = bt.splits.get(node.name)
    kw = dict(precision=precision, dtypes=dtypes)
    copies = param_copy_bytes(graph, bt.block, node.name, split, tp=ctx.tp, **kw) if split is not None else 0.0
    held, wgrad_held = held_bytes(graph, node, gpu=ctx.profile.backend == "nccl", **kw)
    kept = rerun = 0.0
    flops = [0.0, 0.0, 0.0, 0.0]  # matmul fwd, bwd; attention fwd, bwd
    if node.op in SAVED_KINDS:
        own_output = copies if split == "colwise" else 0.0  # a gathered colwise output's local shard
        out = node.output_bytes * activation_scale(node, **kw)
        kept = (out / act_shard + own_output) * f * busiest
        ran = _executed_share(node, ctx)  # under cp, the share of attention's rectangle a rank's kernels run
        at = 2 if node.op == "attention" else 0
        flops[at] = node.fwd_flops * f / shard * ran
        flops[at + 1] = executed_bwd_flops(node) * f / shard * ran  # the audit measures what runs
        # FP8's scaling passes are not kept (types/saved_ops.py): they re-run before the kept GEMM
        rerun = fp8_cast_s(
            node, ctx.profile, precision=precision, batch_fraction=f, shard=shard, backward=False, recipe=ctx.fp8
        )
    else:
        rerun = t_fwd
    one = NodeTerms(
        t_fwd,
        t_bwd,
        weight_grad_s(graph, node, bwd_s=t_bwd),
        fp8,
        *overlap,
        (node.fwd_flops + node.bwd_flops) * f / shard,
        wgrad_held * f / act_shard,
        (held / act_shard + copies) * f * busiest,
        held / act_shard * f if node.op == "loss" else 0.0,  # freed at a split backward's B
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
