"""Tensor parallelism inside one block: legal splits, shard factors and resharding costs (the
layouts, legality rules and comm terms in full: docs/ilp.md, section 1).

Megatron-LM's model (Shoeybi et al. 2019, section 3) generalised to any graph as Alpa's intra-op
pass does (Zheng et al., OSDI'22, section 4): every parameterised node ``v`` picks one split
``s_v`` from :func:`legal_splits`, which fixes the layout of its output and of its input:

    split       input needs     output is       input-grad is    (R replicated, S last dim
    replicate   R               R               R                 sharded, P partial sum,
    colwise     R               S               P                 Q sequence-sharded under
    rowwise     S               P               S                 sequence parallelism)

A block's comm time is a sum of unary terms (per origin reaching the stream), pairwise terms (per
edge from an origin into a parameterised node, on ``b = |src| / |origins(src)|`` bytes), any-of terms
(a shared input all-reduced once however many consumers need it) and gated any-of terms (a
replicated origin whose gradient comes back sharded because a sibling origin is sharded), each a
collective on the tp group priced by autoplan.cost.network.comm on the bytes of the tensor it moves,
in that tensor's run dtype (autoplan/cost/tp/collectives.py). A fused linear whose chunks are
not whole heads per rank is *gathered colwise*
(:func:`autoplan.cost.tp.block.is_gathered`): its compute and weights divide by tp, it pays an
all-gather of its output, and its consumers see a replicated tensor.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

from autoplan.cost.compute.dtypes import DtypePolicy
from autoplan.cost.compute.fp8 import TENSORWISE, Fp8Recipe, fp8_linear
from autoplan.cost.moe.experts import ExpertPlacement
from autoplan.cost.network.mesh import AxisGroup
from autoplan.cost.tp.amax import AMAX_BYTES, amax_reductions, shared_input_amaxes
from autoplan.cost.tp.block import BlockAnalysis, analyse_block
from autoplan.cost.tp.collectives import Collectives, MessageCollectives, Messages
from autoplan.cost.tp.shards import reduce_scattered, shards
from autoplan.errors import PlanError
from autoplan.types.graph import Graph, OpNode
from autoplan.types.profile import Profile

OUT_LAYOUT = {"replicate": "R", "colwise": "S", "rowwise": "R"}  # rowwise P is resolved by its unary term
IN_NEED = {"replicate": "R", "colwise": "R", "rowwise": "S"}
IN_GRAD = {"replicate": "R", "colwise": "P", "rowwise": "S"}
OUT_GRAD_NEED = {"replicate": "R", "colwise": "S", "rowwise": "R"}


@dataclass(frozen=True)
class TPContext:
    profile: Profile
    tp: int
    group: AxisGroup  # the tp group (from mesh_groups)
    sequence_parallel: bool
    precision: str  # 'fp32' | 'bf16' | 'fp16'
    batch_fraction: float  # micro_batch_size / graph.batch_size / cp: the tokens one rank computes
    experts: ExpertPlacement | None = None  # MoE experts' placement (tp = 1 only), autoplan/cost/moe/experts.py
    cp: int = 1  # context-parallel degree: each rank holds 1/cp of every sequence (autoplan/cost/cp/)
    cp_variant: str = "allgather"
    cp_group: AxisGroup | None = None  # the cp group (from mesh_groups), when cp > 1
    fp8: Fp8Recipe = TENSORWISE  # the FP8 recipe its fp8 linears run (cost/compute/fp8.py)
    fused: bool = False  # element-wise ops run as fused regions (autoplan/cost/compute/fusion.py)
    dtypes: DtypePolicy | None = None  # each activation's run dtype (compute/dtypes.py); None: all in precision

    @cached_property  # frozen: computed once per context (replace() builds a new one), asked per block and plan
    def key(self) -> tuple:
        """Every field but the profile (one per cost model): what a memo of per-context prices keys on,
        so a field added here reaches every such memo."""
        context = (self.tp, self.group, self.sequence_parallel, self.precision, self.batch_fraction, self.experts)
        context = context if self.fp8 == TENSORWISE else (*context, self.fp8)
        context = context if self.cp == 1 else (*context, self.cp, self.cp_variant, self.cp_group)
        context = context if self.dtypes is None else (*context, self.dtypes)
        return (*context, "fused") if self.fused else context

    @cached_property
    def dense_key(self) -> tuple:
        """:attr:`key` without the expert placement: all a block that runs no routed experts reads of it."""
        return self.key if self.experts is None else (*self.key[:5], None, *self.key[6:])

    @cached_property
    def unbatched_key(self) -> tuple:
        """:attr:`dense_key` without the batch fraction: all a block's node facts read of it (cost/node_terms.py)."""
        return (*self.dense_key[:4], *self.dense_key[5:])

    @property
    def micro_batch_fraction(self) -> float:
        """micro_batch_size / graph.batch_size: the samples a rank's cp group shares."""
        return self.batch_fraction * self.cp


@dataclass
class TPLayerCost:
    comm_fwd_s: float
    comm_bwd_s: float
    compute_shard: dict[str, int]
    param_shard: dict[str, int]
    activation_shard: dict[str, int]
    whole_bias: frozenset[str] = frozenset()  # rowwise linears: their bias is replicated, not split


# ---- legality ----------------------------------------------------------------------------
def legal_splits(node: OpNode, tp: int) -> tuple[str, ...]:
    """The splits that give correct numbers for ``node`` at ``tp`` and that the executor runs."""
    attrs = node.attrs
    if tp <= 1 or attrs.get("tp_splittable") is False:  # a module the executor cannot split (trace/nodeattrs.py)
        return ("replicate",)
    if node.op == "linear":
        return (
            ("replicate",)
            + (("colwise",) if _colwise_ok(node, tp) else ())
            + (("rowwise",) if _divides(attrs.get("in_features"), tp) else ())
        )
    if node.op == "embedding":
        return (
            ("replicate",)
            + (("colwise",) if _divides(attrs.get("embedding_dim"), tp) else ())
            + (("rowwise",) if _divides(attrs.get("num_embeddings"), tp) else ())
        )
    if node.op == "norm" and len(node.output_shape) >= 3 and node.output_shape[1] % tp == 0:
        return ("replicate", "sequence_parallel")
    return ("replicate",)


def _divides(value: object, tp: int) -> bool:
    return isinstance(value, int) and value > 0 and value % tp == 0


def _colwise_ok(node: OpNode, tp: int) -> bool:
    attrs = node.attrs
    out = attrs.get("out_features") or (node.output_shape[-1] if node.output_shape else None)
    if not _divides(out, tp):
        return False
    head_split = attrs.get("head_split")
    if head_split and not _divides(head_split[0], tp):
        return False  # a shard boundary inside a head (or a q/k/v part): DTensor cannot unflatten it
    attention = attrs.get("attention")
    if not attention:
        return True
    roles = set(attention.get("roles", ()))
    heads_ok = not roles & {"q"} or _divides(attention.get("num_heads"), tp)
    kv = attention.get("num_kv_heads") or attention.get("num_heads")
    return heads_ok and (not roles & {"k", "v"} or _divides(kv, tp))


# ---- priced terms ------------------------------------------------------------------------
@dataclass
class TPTerms:
    """The comm time of one block as terms of at most two splits (seconds, fwd and bwd)."""

    constant: tuple[float, float] = (0.0, 0.0)
    unary: dict[str, dict[str, tuple[float, float]]] = field(default_factory=dict)
    pair: dict[tuple[str, str], dict[tuple[str, str], tuple[float, float]]] = field(default_factory=dict)
    any_of: list[tuple[tuple[float, float], tuple[tuple[str, str], ...]]] = field(default_factory=list)
    constant_at: dict[str, float] = field(
        default_factory=dict
    )  # the constant's forward part, by first consumer (ops.csv)
    gated: list[tuple[tuple[float, float], tuple[str, str], tuple[tuple[str, str], ...]]] = field(
        default_factory=list
    )  # (cost, (w, s_w), choices): charged when w takes s_w and any choice holds (_add_sliced)


def block_terms(graph: Graph, layer: str | None, *, ctx: TPContext) -> TPTerms:
    """Every comm term of block ``layer`` under ``ctx``; cached per context on the graph."""
    cache = graph.__dict__.setdefault("_tp_terms_cache", {})
    key = _terms_key(layer, ctx)
    if key not in cache:
        cache[key] = _terms(graph, analyse_block(graph, layer), ctx)
    return cache[key]


def _terms_key(layer: str | None, ctx: TPContext) -> tuple:
    """All :func:`_terms` reads of ``ctx`` for block ``layer``: the profile's links, tp, its group, sequence
    parallelism, precision, batch fraction, run dtypes (each message in its tensor's run dtype) and, under fp8, the
    recipe's name and whether it casts before the redistributions (tensorwise scales' all-reduces: cost/tp/amax.py)."""
    key = (layer, _link_key(ctx.profile), ctx.tp, ctx.group, ctx.sequence_parallel, ctx.precision, ctx.batch_fraction)
    key = key if ctx.dtypes is None else (*key, ctx.dtypes)
    return key if ctx.precision != "fp8" else (*key, ctx.fp8.name, ctx.fp8.tp_cast_first)


def _link_key(profile) -> tuple:
    """What the terms read from a profile (autoplan.cost.network.comm.collective_time_s: devices_per_node and
    every collective's alpha and busbw on both links), as a cache key: keyed on contents, not on
    ``id(profile)``, whose value a freed profile hands on to a new one (calibration deep-copies)."""
    links = (profile.intra_node, profile.inter_node)
    return (profile.devices_per_node,) + tuple(
        None
        if link is None
        else tuple(sorted((k, f.alpha_s, f.busbw_bytes_per_s) for k, f in link.collectives.items()))
        for link in links
    )


def _terms(graph: Graph, block: BlockAnalysis, ctx: TPContext, coll: "Collectives | None" = None) -> TPTerms:
    terms = TPTerms()
    if ctx.tp <= 1:
        return terms
    coll = coll or Collectives(graph, ctx)
    legal = {v: legal_splits(graph.node(v), ctx.tp) for v in block.params}
    for u in block.params:
        terms.unary[u] = {s: _unary(graph, block, u, s, coll, ctx) for s in legal[u]}
    lay = {u: {s: _effective(s, u in block.gathered) for s in legal[u]} for u in block.params}
    for (u, v), b in block.edges.items():
        moved = block.edge_tensors[(u, v)]
        terms.pair[(u, v)] = {(a, c): _pair(lay[u][a], c, b, coll, moved) for a in legal[u] for c in legal[v]}
    _add_sliced(terms, block, legal, coll, ctx)
    fwd = 0.0
    for src, (b, consumers, needs_grad, shardable) in block.sources.items():
        q = ctx.sequence_parallel and shardable
        gather = coll("all_gather", b, src) if q else 0.0
        fwd += gather
        terms.constant_at[consumers[0]] = terms.constant_at.get(consumers[0], 0.0) + gather
        if needs_grad:
            _source_any_of(terms, (src, b), consumers, legal, q, coll)
        _shared_input_amax(graph, terms, consumers, legal, q, coll, ctx)
    terms.constant = (fwd, 0.0)
    return terms


def block_messages(
    graph: Graph, layer: str | None, tp_plan: dict[str, str], *, ctx: TPContext
) -> tuple[Messages, Messages]:
    """The TP collectives of one micro-batch of block ``layer``, forward and backward: the
    messages behind :func:`tp_layer_cost`'s seconds (the execution audit's prediction)."""
    splits = node_splits(graph, layer, tp_plan, tp=ctx.tp)
    terms = _terms(graph, analyse_block(graph, layer), ctx, coll=MessageCollectives(graph, ctx))
    fwd, bwd = terms_time_s(terms, splits)
    return fwd + Messages(), bwd + Messages()


def _effective(split: str, gathered: bool) -> str:
    """The split as its consumers see it: a gathered colwise node hands on a replicated output."""
    return "replicate" if gathered and split == "colwise" else split


def _unary(
    graph: Graph, block: BlockAnalysis, u: str, split: str, coll: Collectives, ctx: TPContext
) -> tuple[float, float]:
    """``u``'s own collectives under ``split``: its output's (:func:`_unary_output`) and, for a tensorwise FP8
    linear, the scalar all-reduces of its scales (cost/tp/amax.py)."""
    fwd, bwd = _unary_output(block, u, split, coll, ctx)
    fp8 = fp8_linear(graph.node(u), precision=ctx.precision, shard=ctx.tp)
    sequence_output = split == "rowwise" and reduce_scattered(block, u, sequence_parallel=ctx.sequence_parallel)
    scales_fwd, scales_bwd = amax_reductions(split, fp8=fp8, recipe=ctx.fp8, tp=ctx.tp, sequence_output=sequence_output)
    return fwd + coll.scalars("all_reduce", AMAX_BYTES, scales_fwd), bwd + coll.scalars(
        "all_reduce", AMAX_BYTES, scales_bwd
    )


def _unary_output(block: BlockAnalysis, u: str, split: str, coll: Collectives, ctx: TPContext) -> tuple[float, float]:
    sink = block.sinks.get(u, 0.0)
    sp = ctx.sequence_parallel
    if split == "colwise" and u in block.gathered:
        out = float(next(n.output_bytes for n in block.nodes if n.name == u))
        return coll("all_gather", out, u), coll("all_gather", sink, u) if sp and sink else 0.0
    if split == "rowwise":
        out = float(next(n.output_bytes for n in block.nodes if n.name == u))
        if reduce_scattered(block, u, sequence_parallel=sp):
            return coll("reduce_scatter", out, u), coll("all_gather", out, u)
        return coll("all_reduce", out, u), 0.0
    to_stream = sp and u not in block.output_sinks  # the model output is gathered whole: its gradient is a local slice
    if sink and split == "replicate" and settled(block, u):  # whole output sliced to the SP stream, its
        return 0.0, coll("all_gather", sink, u) if to_stream else 0.0  # gradient gathered whole again
    if not sink or split != "colwise":
        return 0.0, 0.0
    return coll("all_gather", sink, u), coll("all_gather", sink, u) if to_stream else 0.0


def _pair(a: str, c: str, b: float, coll: Collectives, tensor: str) -> tuple[float, float]:
    """An edge's terms: ``b`` traced bytes of ``tensor`` (or its gradient) when the layouts disagree."""
    fwd = coll("all_gather", b, tensor) if OUT_LAYOUT[a] == "S" and IN_NEED[c] == "R" else 0.0
    grad, need = IN_GRAD[c], OUT_GRAD_NEED[a]
    bwd = 0.0
    if grad == "P":
        bwd = coll("reduce_scatter" if need == "S" else "all_reduce", b, tensor)
    elif grad == "S" and need == "R":
        bwd = coll("all_gather", b, tensor)
    return fwd, bwd


def settled(block: BlockAnalysis, u: str) -> bool:
    """Whether a replicated ``u`` gets its output's gradient back whole: a Linear, whose output the executor
    settles (execute/tensor_parallel.py); an Embedding's stays as DTensor leaves it, a partial sum on the
    sequence shard that sp_sync.sp_partial_params reduces once a step."""
    return next(n.op for n in block.nodes if n.name == u) == "linear"


def _add_sliced(terms: TPTerms, block: BlockAnalysis, legal: dict, coll: Collectives, ctx: TPContext) -> None:
    """A whole (replicated) output ``w`` that meets a sharded sibling in a pure node: DTensor
    slices ``w`` locally and the node runs sharded (cost/tp/shards.py:pure_layout), so the
    gradient comes back sharded and is gathered whole where ``w``'s producer settled it: one
    all-gather of ``|w|`` in the backward, when ``w`` is replicated and any sibling is sharded
    (a gated any-of term). A ``w`` on the sequence-parallel stream pays it in its unary term."""
    sp = ctx.sequence_parallel
    met: dict[str, set[str]] = {}
    for u, w in block.siblings:
        met.setdefault(u, set()).add(w)
        met.setdefault(w, set()).add(u)
    for w, others in sorted(met.items()):
        on_stream = sp and block.sinks.get(w) and w not in block.output_sinks
        if "replicate" not in legal[w] or not settled(block, w) or on_stream:
            continue
        choices = tuple(
            (u, split)
            for u in sorted(others)
            for split in ("colwise", "rowwise")
            if split in legal[u]
            and (u not in block.gathered if split == "colwise" else reduce_scattered(block, u, sequence_parallel=sp))
        )
        if choices:
            out = float(next(n.output_bytes for n in block.nodes if n.name == w))
            terms.gated.append(((0.0, coll("all_gather", out, w)), (w, "replicate"), choices))


def _source_any_of(
    terms: TPTerms, source: tuple[str, float], consumers: list[str], legal: dict, q: bool, coll: Collectives
) -> None:
    """A stream tensor's gradient, ``source`` (its name, traced bytes): reduced once if any consumer is colwise,
    gathered once if any is rowwise."""
    src, b = source
    col = tuple((v, "colwise") for v in consumers if "colwise" in legal[v])
    row = tuple((v, "rowwise") for v in consumers if "rowwise" in legal[v])
    if col:
        terms.any_of.append(((0.0, coll("reduce_scatter" if q else "all_reduce", b, src)), col))
    if row:
        terms.any_of.append(((0.0, coll("all_to_all" if q else "all_gather", b, src)), row))


def _shared_input_amax(
    graph: Graph, terms: TPTerms, consumers: list[str], legal: dict, q: bool, coll: Collectives, ctx: TPContext
) -> None:
    """A stream input's tensorwise FP8 amax, all-reduced once in the forward if any FP8 consumer is colwise and the
    recipe casts it sequence-sharded, before the all-gather (cost/tp/amax.py ``shared_input_amaxes``)."""
    count = shared_input_amaxes(sequence_sharded=q, recipe=ctx.fp8, tp=ctx.tp) if ctx.precision == "fp8" else 0
    fp8 = [v for v in consumers if fp8_linear(graph.node(v), precision=ctx.precision, shard=ctx.tp)]
    col = tuple((v, "colwise") for v in fp8 if "colwise" in legal[v])
    if count and col:
        terms.any_of.append(((coll.scalars("all_reduce", AMAX_BYTES, count), 0.0), col))


# ---- evaluating a plan -------------------------------------------------------------------
def node_splits(graph: Graph, layer: str | None, tp_plan: dict[str, str], *, tp: int) -> dict[str, str]:
    """Each parameterised node's split from ``tp_plan`` (by module FQN), checked for legality."""
    splits = {}
    for v in analyse_block(graph, layer).params:
        node = graph.node(v)
        split = tp_plan.get(node.module, "replicate") if tp > 1 else "replicate"
        if split not in legal_splits(node, tp):
            raise PlanError(
                f"tp_plan['{node.module}']='{split}' is not legal at tp={tp} "
                f"(legal: {', '.join(legal_splits(node, tp))}); see docs/ilp.md for the rules."
            )
        splits[v] = split
    return splits


def terms_time_s(terms: TPTerms, splits: dict[str, str]) -> tuple[float, float]:
    """Forward and backward comm seconds of ``splits`` under ``terms``."""
    fwd, bwd = terms.constant
    for u, by_split in terms.unary.items():
        f, b = by_split[splits[u]]
        fwd, bwd = fwd + f, bwd + b
    for (u, v), by_pair in terms.pair.items():
        f, b = by_pair[(splits[u], splits[v])]
        fwd, bwd = fwd + f, bwd + b
    for (f, b), choices in terms.any_of:
        if any(splits[v] == s for v, s in choices):
            fwd, bwd = fwd + f, bwd + b
    for (f, b), (w, s_w), choices in terms.gated:
        if splits[w] == s_w and any(splits[v] == s for v, s in choices):
            fwd, bwd = fwd + f, bwd + b
    return fwd, bwd


def tp_layer_cost(graph: Graph, layer: str | None, tp_plan: dict[str, str], *, ctx: TPContext) -> TPLayerCost:
    """TP comm and shard factors of block ``layer`` (None = nodes outside every block), read only: cached on the
    graph per the block's splits and :func:`block_terms`' key. The comm seconds read the terms and the splits, the
    shards the splits, tp and sequence parallelism, the rowwise biases the splits: contexts that differ only in what
    none of them reads (fusion, cp, the expert placement, the FP8 recipe outside fp8) share one."""
    splits = node_splits(graph, layer, tp_plan, tp=ctx.tp)
    cache = graph.__dict__.setdefault("_tp_layer_cost_cache", {})
    key = (tuple(splits.items()), *_terms_key(layer, ctx))
    if key not in cache:
        cache[key] = _layer_cost(graph, layer, splits, ctx)
    return cache[key]


def _layer_cost(graph: Graph, layer: str | None, splits: dict[str, str], ctx: TPContext) -> TPLayerCost:
    fwd, bwd = terms_time_s(block_terms(graph, layer, ctx=ctx), splits)
    sp = ctx.sequence_parallel and ctx.tp > 1
    compute, param, act = shards(graph, layer, splits, tp=ctx.tp, sequence_parallel=sp)
    whole_bias = frozenset(v for v, split in splits.items() if split == "rowwise" and graph.node(v).op == "linear")
    return TPLayerCost(
        comm_fwd_s=fwd,
        comm_bwd_s=bwd,
        compute_shard=compute,
        param_shard=param,
        activation_shard=act,
        whole_bias=whole_bias,
    )
