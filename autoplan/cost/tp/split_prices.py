"""The prices of a block's splits: what the intra-op ILP (solve/intra_op.py) minimises and bounds.

For each parameterised op ``v`` of a block and each legal split ``s`` (cost/tp/splits.py), its
compute and unary TP collective seconds and its parameter + saved bytes; for each pure node its
price on each layout its origins allow (R, S, Q); the pair and any-of collective terms of
:func:`autoplan.cost.tp.splits.block_terms`; and the constant rest. Times and shard factors are
those CostModel charges (cost/compute/op_costs.py, cost/tp/shards.py), so the ILP's objective and
memory row equal what CostModel charges the block (tests/unit/solve/test_solve_agreement.py); under
context parallelism an attention's exposed K,V time and gathered K,V are part of its price (cost/cp/block.py).
:func:`memory_budget` is the bytes a block's splits may use when a plan did not fit
(cost/memory/per_device.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from autoplan.cost.compute.dtypes import DtypePolicy, dtype_policy, dtypes_of
from autoplan.cost.compute.fusion import fuses_elementwise
from autoplan.cost.compute.op_costs import NodeTimes, held_bytes, node_time_s, node_times_s
from autoplan.cost.cp.block import context_parallel
from autoplan.cost.cp.exposed import attention_time_factor
from autoplan.cost.memory.per_device import model_states, usable_bytes
from autoplan.cost.network.mesh import mesh_groups
from autoplan.cost.pp.schedule import in_flight_chunks
from autoplan.cost.tp.block import BlockAnalysis, analyse_block
from autoplan.cost.tp.memory import param_copy_bytes, stream_copy_bytes
from autoplan.cost.tp.shards import (
    layouts_of,
    param_node_shards,
    pure_layout,
    pure_node_shards,
    shard_dim,
    sharding_origins,
    stream_node_shards,
)
from autoplan.cost.tp.splits import TPContext, TPTerms, block_terms, legal_splits, node_splits, terms_time_s
from autoplan.types.cost import Cost
from autoplan.types.graph import Graph, OpNode
from autoplan.types.plan import Plan
from autoplan.types.profile import Profile


@dataclass
class PureNode:
    """A pure node's time and saved bytes on each layout its origins can give it (R, S, Q), and
    the origins whose split gives it each sharded layout (cost/tp/shards.py:sharding_origins)."""

    origins: frozenset[str]
    time_s: dict[str, float]
    bytes: dict[str, float]
    sharding: dict[str, tuple[str, ...]] = field(default_factory=dict)


@dataclass
class BlockPrices:
    """Everything the ILP (and the brute force that checks it) prices, for one block."""

    params: list[str]
    legal: dict[str, tuple[str, ...]]
    unary_s: dict[str, dict[str, float]]  # compute + unary comm, per split
    unary_bytes: dict[str, dict[str, float]]  # parameter + saved bytes, per split
    pure: dict[str, PureNode]  # pure node -> its price per layout
    terms: TPTerms
    forward_repeats: int
    constant_s: float = 0.0
    constant_bytes: float = 0.0
    ties: list[tuple[str, str]] = field(default_factory=list)
    sequence_parallel: bool = False
    block: BlockAnalysis | None = None  # the block's structure (layouts of pure nodes)
    dim_ties: list[tuple[str, str, str, str]] = field(default_factory=list)  # (u, w, kind_u, kind_w)
    step_s: dict[str, dict[str, float]] = field(default_factory=dict)  # the ILP's step term (cost/dp/param_step.py)

    def evaluate(self, splits: dict[str, str]) -> tuple[float, float]:
        """(seconds, bytes) of ``splits``: the ILP's objective and memory row, evaluated directly."""
        fwd, bwd = terms_time_s(_without_unary(self.terms), splits)
        time_s = self.constant_s + self.forward_repeats * fwd + bwd
        memory = self.constant_bytes
        for v in self.params:
            time_s += self.unary_s[v][splits[v]]
            memory += self.unary_bytes[v][splits[v]]
        for pure in self.pure.values():
            layout = pure_layout(self.block, pure.origins, splits, sequence_parallel=self.sequence_parallel)
            time_s += pure.time_s[layout]
            memory += pure.bytes[layout]
        return time_s, memory

    def min_memory_bytes(self) -> float:
        """A lower bound on the memory row: each op at its lightest split, independently."""
        memory = self.constant_bytes + sum(min(self.unary_bytes[v].values()) for v in self.params)
        return memory + sum(min(pure.bytes.values()) for pure in self.pure.values())

    def fingerprint(self) -> tuple:
        """Every name and number the ILP (solve/intra_op.py) and its answer read of these prices, in the order it
        reads them: prices with equal fingerprints are one ILP, whatever context (dtype policy) priced them."""
        t = self.terms
        read = (self.params, self.legal, self.unary_s, self.unary_bytes, self.pure, t.constant, t.pair, t.any_of)
        rest = (t.gated, self.forward_repeats, self.constant_s, self.constant_bytes, self.ties, self.dim_ties)
        return _frozen((*read, *rest, self.sequence_parallel, self.step_s))

    def respects_ties(self, splits: dict[str, str]) -> bool:
        if any(splits[u] != splits[w] for u, w in self.ties):
            return False
        return all(shard_dim(ku, splits[u]) == shard_dim(kw, splits[w]) for u, w, ku, kw in self.dim_ties)


_LEAVES = frozenset((float, int, str, bool, type(None), frozenset))  # _frozen returns these as they are


def _frozen(value):
    """``value`` with its dicts (in order), lists and PureNodes as tuples: hashable, equal where the values are.
    A leaf is kept without a call of its own (~320,000 leaves on DeepSeek-V3)."""
    if isinstance(value, dict):
        return tuple((k, v if type(v) in _LEAVES else _frozen(v)) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return tuple(v if type(v) in _LEAVES else _frozen(v) for v in value)
    if isinstance(value, PureNode):
        return (value.origins, _frozen(value.time_s), _frozen(value.bytes), _frozen(value.sharding))
    return value


def _without_unary(terms: TPTerms) -> TPTerms:
    return TPTerms(constant=terms.constant, unary={}, pair=terms.pair, any_of=terms.any_of, gated=terms.gated)


def price_block(
    graph: Graph,
    layer: str | None,
    *,
    ctx: TPContext,
    forward_repeats: int = 1,
    param_bytes_factor: float = 0.0,
    activation_factor: float = 0.0,
    node_times: NodeTimes | None = None,
    frozen_param_bytes_factor: float | None = None,
) -> BlockPrices:
    """Price block ``layer`` for the ILP. ``param_bytes_factor`` multiplies traced parameter
    bytes (``frozen_param_bytes_factor`` those of frozen ones, weights only; the same when None),
    and ``activation_factor`` the saved bytes of the traced batch in the run's precision
    (``compute.saved_activation_bytes``), into bytes per device (0 = ignore). Times and shard
    factors are those CostModel charges (cost/compute/op_costs.py, tp_shards.shards); ``node_times``
    memoises the op times."""
    block = analyse_block(graph, layer)
    terms = block_terms(graph, layer, ctx=ctx)
    dtypes = dtypes_of(graph, ctx.dtypes)  # each activation's run dtype (compute/dtypes.py)
    tp, sp = ctx.tp, ctx.sequence_parallel and ctx.tp > 1
    prices = BlockPrices(
        params=list(block.params),
        legal={v: legal_splits(graph.node(v), tp) for v in block.params},
        unary_s={},
        unary_bytes={},
        pure={},
        terms=terms,
        forward_repeats=forward_repeats,
        sequence_parallel=sp,
        block=block,
    )

    def time_of(node, shard: int) -> float:
        return node_time_s(
            graph,
            node,
            ctx.profile,
            precision=ctx.precision,
            batch_fraction=ctx.batch_fraction,
            shard=shard,
            forward_repeats=forward_repeats,
            times=node_times,
            recipe=ctx.fp8,
            fused=ctx.fused,
            dtypes=dtypes,
        )

    seen_params: set[str] = set()
    gpu = ctx.profile.backend == "nccl"
    for node in block.nodes:
        own = [p for p in node.param_names if p not in seen_params]
        seen_params.update(own)
        frozen_factor = param_bytes_factor if frozen_param_bytes_factor is None else frozen_param_bytes_factor
        pbytes = sum(
            graph.parameters[p].bytes * (param_bytes_factor if graph.parameters[p].trainable else frozen_factor)
            for p in own
            if p in graph.parameters
        )
        saved = held_bytes(graph, node, gpu=gpu, precision=ctx.precision, dtypes=dtypes)[0]  # node_saved_bytes, cached
        abytes = saved * activation_factor if activation_factor else 0.0
        if node.name in prices.legal:
            copies = {
                split: param_copy_bytes(graph, block, node.name, split, tp=tp, precision=ctx.precision, dtypes=dtypes)
                * activation_factor
                for split in prices.legal[node.name]
            }
            _price_param(prices, node, time_of, pbytes, abytes, copies, tp=tp)
        elif node.name in block.origins:
            origins, sharding = block.origins[node.name], _sharding(graph, layer, node.name, prices.legal, tp=tp, sp=sp)
            shard = {lay: pure_node_shards(lay, tp=tp) for lay in layouts_of(sharding)}
            kv = {
                lay: _cp_price(graph, node, ctx, c, forward_repeats, activation_factor) for lay, (c, _) in shard.items()
            }
            prices.pure[node.name] = PureNode(
                origins=origins,
                time_s={lay: time_of(node, c) + kv[lay][0] for lay, (c, _) in shard.items()},
                bytes={lay: abytes / a + kv[lay][1] for lay, (_, a) in shard.items()},
                sharding=sharding,
            )
        else:
            compute, act = stream_node_shards(
                node, tp=tp, sequence_parallel=sp, token_wise=node.name in block.token_wise
            )
            kv_s, kv_bytes = _cp_price(graph, node, ctx, compute, forward_repeats, activation_factor)
            prices.constant_s += time_of(node, compute) + kv_s
            prices.constant_bytes += pbytes + abytes / act + kv_bytes
    prices.constant_bytes += (
        sum(
            stream_copy_bytes(
                graph, block, tp=tp, sequence_parallel=sp, precision=ctx.precision, dtypes=dtypes
            ).values()
        )
        * activation_factor
    )
    _add_ties(graph, prices)
    return prices


def _sharding(
    graph: Graph, layer: str | None, name: str, legal: dict[str, tuple[str, ...]], *, tp: int, sp: bool
) -> dict[str, tuple[str, ...]]:
    """``sharding_origins`` of pure node ``name`` (read only), cached on the graph per (block, node, tp, sp): it reads
    the block's structure and its origins' ``legal`` splits, which are ``legal_splits`` at ``tp``, and no context."""
    cache = graph.__dict__.setdefault("_pure_sharding_cache", {})
    key = (layer, name, tp, sp)
    if key not in cache:
        block = analyse_block(graph, layer)
        cache[key] = sharding_origins(block, block.origins[name], legal, sequence_parallel=sp)
    return cache[key]


def _cp_price(
    graph: Graph, node: OpNode, ctx: TPContext, shard: int, forward_repeats: int, activation_factor: float
) -> tuple[float, float]:
    """An attention's context-parallel seconds and held bytes at ``shard``, as cost/blocks.py charges
    them (cost/cp/block.py; ``activation_factor`` / batch_fraction micro-batches in flight); (0, 0) elsewhere."""
    if ctx.cp == 1 or node.op != "attention":
        return 0.0, 0.0
    t_fwd, t_bwd = node_times_s(
        graph,
        node,
        ctx.profile,
        precision=ctx.precision,
        batch_fraction=ctx.batch_fraction,
        shard=shard,
        dtypes=dtypes_of(graph, ctx.dtypes),
    )
    factor = attention_time_factor(ctx.cp, causal=bool(node.attrs.get("causal")))
    kv = context_parallel([(node, shard, t_fwd * factor, t_bwd * factor)], ctx, graph)
    return forward_repeats * kv.fwd_s + kv.bwd_s, kv.held_bytes * activation_factor / ctx.batch_fraction


def _price_param(
    prices: BlockPrices, node, time_of, pbytes: float, abytes: float, copies: dict[str, float], *, tp: int
) -> None:
    prices.unary_s[node.name], prices.unary_bytes[node.name] = {}, {}
    for s in prices.legal[node.name]:
        compute, param, act = param_node_shards(
            prices.block, node.name, s, tp=tp, sequence_parallel=prices.sequence_parallel
        )
        prices.unary_s[node.name][s] = time_of(node, compute) + _unary_comm(
            prices.terms, node.name, s, prices.forward_repeats
        )
        prices.unary_bytes[node.name][s] = pbytes / param + abytes / act + copies[s]


def _unary_comm(terms: TPTerms, v: str, split: str, forward_repeats: int) -> float:
    fwd, bwd = terms.unary.get(v, {}).get(split, (0.0, 0.0))
    return forward_repeats * fwd + bwd


def _add_ties(graph: Graph, prices: BlockPrices) -> None:
    by_module: dict[str, str] = {}
    by_param: dict[str, str] = {}
    for v in prices.params:
        node = graph.node(v)
        if node.module in by_module:
            prices.ties.append((by_module[node.module], v))
        by_module.setdefault(node.module, v)
        for p in node.param_names:
            if p in by_param and graph.node(by_param[p]).module != node.module:
                prices.dim_ties.append((by_param[p], v, graph.node(by_param[p]).op, node.op))
            by_param.setdefault(p, v)


def split_context(
    graph: Graph,
    profile: Profile,
    *,
    dp: int,
    tp: int,
    pp: int,
    sequence_parallel: bool,
    precision: str,
    micro_batch_size: int,
    cp: int = 1,
    cp_variant: str = "allgather",
    fused: bool = False,
    dtypes: DtypePolicy | None = None,
) -> TPContext:
    """The context a block's splits are priced in: its tp group on the profile's nodes (cost/network/mesh.py)
    and a rank's share of the traced batch (1/cp of the micro-batch's tokens under context parallelism);
    no expert placement (experts run at tp = 1); ``fused``: element-wise ops as fused regions
    (cost/compute/fusion.py); ``dtypes``: the activations' run dtypes (compute/dtypes.py; None: all in
    ``precision``, as fp32 plans and runtimes that cast the whole model run)."""
    groups = mesh_groups(profile, dp=dp, tp=tp, pp=pp, cp=cp)
    return TPContext(
        profile=profile,
        tp=tp,
        group=groups["tp"],
        sequence_parallel=sequence_parallel,
        precision=precision,
        batch_fraction=micro_batch_size / graph.batch_size / cp,
        cp=cp,
        cp_variant=cp_variant,
        cp_group=groups["cp"] if cp > 1 else None,
        fused=fused,
        dtypes=dtypes,
    )


@dataclass(frozen=True)
class MemoryBudget:
    """Per-block bytes for the ILP's memory row, with the multipliers that turn traced parameter
    bytes and saved bytes in the run's precision into bytes per device (see :func:`price_block`)."""

    block_bytes: float
    outside_bytes: float
    param_bytes_factor: float
    activation_factor: float
    # a frozen parameter's: its weights only (docs/cost-model.md, "Frozen parameters"); None: param_bytes_factor
    frozen_param_bytes_factor: float | None = None


def memory_budget(
    graph: Graph, profile: Profile, *, plan: Plan, cost: Cost, node_times: NodeTimes | None = None
) -> MemoryBudget:
    """The ILP memory row for ``plan`` (which did not fit): usable memory less comm buffers and
    the outside modules' bytes (kept at most what they use now), shared by the blocks of the
    fullest stage; under full recomputation one block's full activations (live while it is
    recomputed) are spread over them. Bytes per device follow autoplan/cost/memory/per_device.py;
    ``node_times`` memoises the op times (the search's CostModel's)."""
    blocks = max(1, max(len(chunk) for chunk in plan.stages) * plan.virtual_stages) if plan.stages else 1
    states = model_states(
        params=1.0,
        precision=plan.precision,
        zero_stage=plan.zero_stage,
        dp=plan.dp * plan.cp,
        pp=plan.pp,
        offload=plan.offload,
    )
    traced_param = graph.param_bytes / graph.param_count if graph.param_bytes > 0 and graph.param_count > 0 else 4.0
    in_flight = 1.0 / blocks if plan.recompute == "full" else in_flight_chunks(plan, 0)
    factors = dict(
        param_bytes_factor=(states.weights_bytes + states.grads_bytes + states.optimizer_bytes) / traced_param,
        activation_factor=in_flight * plan.micro_batch_size / graph.batch_size / plan.cp,
        frozen_param_bytes_factor=states.weights_bytes / traced_param,
    )  # saved bytes come in the precision
    ctx = split_context(
        graph,
        profile,
        dp=plan.dp,
        tp=plan.tp,
        pp=plan.pp,
        sequence_parallel=plan.sequence_parallel,
        precision=plan.precision,
        micro_batch_size=plan.micro_batch_size,
        cp=plan.cp,
        cp_variant=plan.cp_variant,
        fused=fuses_elementwise(plan),
        dtypes=dtype_policy(plan, backend=profile.backend),
    )
    outside = _outside_prices(graph, ctx, node_times, factors)
    outside_bytes = outside.evaluate(node_splits(graph, None, plan.tp_plan, tp=plan.tp))[1]
    free = usable_bytes(profile.device.memory_bytes) - cost.comm_buffer_bytes - outside_bytes
    return MemoryBudget(
        block_bytes=free / blocks, outside_bytes=outside_bytes, **factors
    )  # negative: nothing left (infeasible)


def _outside_prices(graph: Graph, ctx: TPContext, node_times: NodeTimes | None, factors: dict) -> BlockPrices:
    """:func:`price_block` of the nodes outside every block (read only), kept on ``node_times`` (one graph's op times
    on one profile) per ``ctx.key`` (every field of the context but its profile) and ``factors``: all it reads. The
    search asks :func:`memory_budget` once per tp_plan whose plans did not fit, and most share their context."""
    if node_times is None or node_times.graph is not graph or node_times.profile is not ctx.profile:
        return price_block(graph, None, ctx=ctx, node_times=node_times, **factors)
    key = (*ctx.key, *factors.items())
    hit = node_times.outside_prices.get(key)
    if hit is None:
        hit = node_times.outside_prices[key] = price_block(graph, None, ctx=ctx, node_times=node_times, **factors)
    return hit
