"""Per-block summaries: what one micro-batch of one block costs on one device (docs/cost-model.md,
"Blocks"). A :class:`LayerSummary` is priced once per block group and shared choices and reused,
so :class:`autoplan.cost.model.CostModel` prices a plan with arithmetic only.

Per block and micro-batch (``f`` = micro_batch_size / graph.batch_size):

- ``fwd_s``/``bwd_s``: the sum of :func:`autoplan.cost.compute.op_costs.node_times_s` over the
  block's nodes, each with its compute shard from ``tp_layer_cost`` and its dispatch overhead.
- ``tp_fwd_s``/``tp_bwd_s``: the block's TP collectives (``tp_layer_cost``).
- ``wgrad_s``: of ``bwd_s``, the weight-gradient GEMMs' seconds (W; autoplan/cost/pp/split_backward.py);
  ``wgrad_held_bytes``: their output gradients, kept from B to W (same module).
- ``saved_bytes`` = sum of ``saved_bytes * f * dtype_scale / activation_shard`` (Korthikanti et al. 2022 section 4)
  plus the copies TP resharding keeps (autoplan/cost/tp/memory.py); the routed experts' nodes times the imbalance
  ``i`` under ep > 1, and the combined rows the dispatch weights (cost/moe/experts.py ``dispatch_saved_bytes``).
- ``loss_grad_bytes`` = ``(|inputs| + saved(loss)) * f``, the loss's backward transient.
- selective recomputation (op-level, as torchtitan runs it; ``SAVED_KINDS``, shared with
  autoplan/execute/recompute.py): ``selective_recompute_s`` is the forward time of the nodes
  that are not kept, ``selective_dropped_bytes`` = saved_bytes - (input_bytes + kept outputs), the
  expert all-to-alls' outputs among the kept (cost/moe/experts.py ``a2a_output_bytes``).
- full recomputation (Chen et al. 2016; Korthikanti et al. 2022 section 4.3): only
  ``input_bytes`` is kept, and the forward and its TP collectives run twice.
- context parallelism (``ctx.cp`` > 1): ``f`` is divided by cp (each rank holds 1/cp of every
  sequence); ``cp_fwd_s``/``cp_bwd_s``: each attention's K,V traffic left exposed beside its compute
  (autoplan/cost/cp/), and under allgather the gathered K,V join ``saved_bytes``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from autoplan.cost.compute.dtypes import RunDtypes
from autoplan.cost.compute.op_costs import NodeTimes
from autoplan.cost.compute.roofline import activation_scale, input_bytes_of, saved_activation_bytes
from autoplan.cost.cp.block import context_parallel
from autoplan.cost.cp.messages import CpMessage
from autoplan.cost.moe.experts import BlockExperts, block_experts
from autoplan.cost.node_terms import BlockTerms, block_terms
from autoplan.cost.tp.block import block_nodes
from autoplan.cost.tp.memory import stream_copy_bytes
from autoplan.cost.tp.splits import TPContext
from autoplan.types.graph import PARAM_KINDS, Graph, OpNode


@dataclass(frozen=True)
class LayerSummary:
    fwd_s: float
    bwd_s: float  # of which wgrad_s is weight gradients (W), the rest input gradients (B)
    selective_recompute_s: float  # forward of the nodes selective recomputation re-runs
    tp_fwd_s: float
    tp_bwd_s: float
    saved_bytes: float
    selective_dropped_bytes: float
    input_bytes: float
    param_count: float  # parameters held per device (after tp sharding), unique names
    param_names: tuple[str, ...]
    param_numels: tuple[float, ...]  # elements of each of param_names held per device (after tp sharding)
    flops: float  # forward + backward FLOPs of one micro-batch, per device (model FLOPs)
    matmul_fwd_flops: float = 0.0  # linears, matmuls and convolutions' share of flops, forward (the audit's measure)
    matmul_bwd_flops: float = 0.0
    attention_fwd_flops: float = 0.0
    attention_bwd_flops: float = 0.0
    loss_grad_bytes: float = 0.0  # gradients the loss's backward makes while every activation is alive
    tp_matmul_fwd_s: float = (
        0.0  # the split (colwise/rowwise) linears' time, which tp_comm_overlap hides collectives under
    )
    tp_matmul_bwd_s: float = 0.0
    tp_overlap_chunking_fwd_s: float = 0.0  # their extra time run as tp token slices (autoplan/cost/tp/overlap.py)
    tp_overlap_chunking_bwd_s: float = 0.0
    ep_fwd_s: float = 0.0  # expert-parallel all-to-all (autoplan/cost/moe/experts.py), forward
    ep_bwd_s: float = 0.0
    expert_param_count: float = 0.0  # routed experts' parameters held per device (1/ep of them)
    cp_fwd_s: float = 0.0  # context parallelism's K,V traffic exposed beside attention (autoplan/cost/cp/), forward
    cp_bwd_s: float = 0.0
    cp_messages: tuple[CpMessage, ...] = ()  # what those calls send (autoplan/cost/cp/messages.py), for the audit
    fp8_params: float = 0.0  # FP8 linears' weights held per device: what FSDP2 may gather in FP8 (cost/dp/messages.py)
    frozen_param_count: float = 0.0  # of param_count, the frozen ones (requires_grad=False): held, never trained
    output_bytes: float = 0.0  # what the block hands the next node per micro-batch (cost/memory/activation_offload.py)
    frozen_expert_param_count: float = 0.0  # of expert_param_count, the frozen ones
    frozen_names: frozenset[str] = frozenset()  # the frozen ones of param_names
    wgrad_s: float = 0.0  # of bwd_s, the weight gradients (W: cost/pp/split_backward.py)
    wgrad_held_bytes: float = 0.0  # output gradients kept from B to W when a schedule splits them (same module)
    loss_saved_bytes: float = 0.0  # of saved_bytes, the loss's own (torch's split backward frees them at B)
    expert_fwd_s: float = 0.0  # of fwd_s, the routed experts' grouped GEMMs (cost/moe/a2a_overlap.py pairs them)
    expert_bwd_s: float = 0.0
    #: of input_bytes, the inputs whose gradient goes back (Graph.grad_nodes: not masks or rotary tables)
    input_grad_bytes: float = 0.0

    @property
    def trainable_param_count(self) -> float:
        """Parameters held per device that get gradients, optimizer state and sync."""
        return self.param_count - self.frozen_param_count

    @property
    def trainable_dense_count(self) -> float:
        """The trainable parameters outside the routed experts (synced over all dp ranks)."""
        return self.trainable_param_count - (self.expert_param_count - self.frozen_expert_param_count)


@dataclass(frozen=True)
class BlockStructure:
    """Split-independent facts about a block, computed once per graph."""

    nodes: tuple[OpNode, ...]
    inputs: tuple[OpNode, ...]
    preds: dict[str, tuple[OpNode, ...]]  # node -> the nodes whose outputs it reads
    outputs: tuple[OpNode, ...] = ()  # the block's nodes read by nodes outside it (its output at the boundary)


def block_structure(graph: Graph, layer: str | None, *, nodes: list[OpNode] | None = None) -> BlockStructure:
    """The nodes, block inputs and readers of ``layer`` (module docstring)."""
    nodes = block_nodes(graph, layer) if nodes is None else nodes
    names = {n.name for n in nodes}
    preds, succs = graph.adjacency()
    outside = {p for n in nodes for p in preds[n.name] if p not in names}
    inputs = tuple(graph.node(p) for p in sorted(outside) if graph.node(p).op != "input" or layer is not None)
    readers = {n.name: tuple(graph.node(p) for p in preds[n.name]) for n in nodes}
    outputs = tuple(n for n in nodes if any(s not in names for s in succs[n.name]))
    return BlockStructure(nodes=tuple(nodes), inputs=inputs, preds=readers, outputs=outputs)


def summarise(
    graph: Graph,
    structure: BlockStructure,
    *,
    layer: str | None,
    tp_plan: dict[str, str],
    ctx: TPContext,
    node_times: NodeTimes | None = None,
    terms: BlockTerms | None = None,
) -> LayerSummary:
    """Price one micro-batch of the block (module docstring); ``node_times`` memoises op times, and ``terms``
    are the block's node terms under ``tp_plan`` and ``ctx`` but for its expert placement (cost/node_terms.py:
    priced once per context, the routed experts' nodes again per placement)."""
    nodes = structure.nodes
    if terms is None:
        terms = block_terms(graph, nodes, layer=layer, tp_plan=tp_plan, ctx=ctx, node_times=node_times)
    f, precision, dtypes = ctx.batch_fraction, ctx.precision, terms.dtypes
    tp_cost, block = terms.tp_cost, terms.block
    experts = block_experts(graph, nodes, ctx.profile, precision=precision, batch_fraction=f, place=ctx.experts)
    t = terms.sums(ctx, experts)
    saved, gpu = t.saved_bytes, ctx.profile.backend == "nccl"
    names = {n.name for n in structure.nodes}
    gathered = stream_copy_bytes(
        graph, block, tp=ctx.tp, sequence_parallel=ctx.sequence_parallel, precision=precision, dtypes=dtypes
    )
    saved += sum(b for consumer, b in gathered.items() if consumer in names) * f
    facts = terms.facts  # what reads no batch fraction, summed once per facts (cost/node_terms.py BlockFacts)
    if facts.params is None:
        facts.params = _params(graph, structure.nodes, tp_cost.param_shard, tp_cost.whole_bias)
    if facts.loss_grad_bytes is None:
        kw = dict(precision=precision, gpu=gpu, dtypes=dtypes)
        facts.loss_grad_bytes = sum(loss_grad_bytes(structure, n, **kw) for n in structure.nodes)
    held, params = facts.params
    held, params, expert_params = _split_experts(held, params, experts)
    inputs = _input_bytes(structure, ctx, dtypes)
    grads = graph.grad_nodes()
    input_grads = _input_bytes(structure, ctx, dtypes, nodes=tuple(n for n in structure.inputs if n.name in grads))
    outputs = _input_bytes(structure, ctx, dtypes, nodes=structure.outputs)
    cp = context_parallel(terms.attention, ctx, graph)
    saved += cp.held_bytes + (experts.dispatch_saved_bytes if experts else 0.0)
    return LayerSummary(
        fwd_s=t.fwd_s,
        bwd_s=t.bwd_s,
        wgrad_s=t.wgrad_s,
        wgrad_held_bytes=t.wgrad_held_bytes,
        loss_saved_bytes=t.loss_saved_bytes,
        selective_recompute_s=t.rerun_s,
        tp_fwd_s=tp_cost.comm_fwd_s,
        tp_bwd_s=tp_cost.comm_bwd_s,
        saved_bytes=saved,
        selective_dropped_bytes=max(0.0, saved - inputs - t.kept_bytes - (experts.a2a_kept_bytes if experts else 0.0)),
        loss_grad_bytes=facts.loss_grad_bytes * f,
        input_bytes=inputs,
        input_grad_bytes=input_grads,
        output_bytes=outputs,
        param_count=params,
        param_names=tuple(held),
        param_numels=tuple(held.values()),
        flops=t.flops,
        matmul_fwd_flops=t.matmul_fwd_flops,
        matmul_bwd_flops=t.matmul_bwd_flops,
        attention_fwd_flops=t.attention_fwd_flops,
        attention_bwd_flops=t.attention_bwd_flops,
        tp_matmul_fwd_s=t.tp_matmul_fwd_s,
        tp_matmul_bwd_s=t.tp_matmul_bwd_s,
        tp_overlap_chunking_fwd_s=t.tp_chunking_fwd_s,
        tp_overlap_chunking_bwd_s=t.tp_chunking_bwd_s,
        ep_fwd_s=experts.a2a_fwd_s if experts else 0.0,
        ep_bwd_s=experts.a2a_bwd_s if experts else 0.0,
        expert_fwd_s=t.expert_fwd_s,
        expert_bwd_s=t.expert_bwd_s,
        expert_param_count=expert_params,
        cp_fwd_s=cp.fwd_s,
        cp_bwd_s=cp.bwd_s,
        cp_messages=cp.messages,
        fp8_params=t.fp8_params,
        frozen_param_count=sum(n for name, n in held.items() if name in graph.frozen_params),
        frozen_names=frozenset(held) & graph.frozen_params,
        frozen_expert_param_count=sum(
            n for name, n in held.items() if name in graph.frozen_params and experts and name in experts.param_names
        ),
    )


def _split_experts(
    held: dict[str, float], params: float, experts: BlockExperts | None
) -> tuple[dict[str, float], float, float]:
    """The held parameters with the routed experts' divided over ep: (per name, total, experts')."""
    if experts is None:
        return held, params, 0.0
    mine = {name: n / experts.ep for name, n in held.items() if name in experts.param_names}
    saved = sum(held[name] - n for name, n in mine.items())
    return {**held, **mine}, params - saved, sum(mine.values())


def loss_grad_bytes(
    structure: BlockStructure, node: OpNode, *, precision: str, gpu: bool, dtypes: RunDtypes | None = None
) -> float:
    """Bytes the backward of a loss node makes at its start (module docstring): the gradient of
    each floating input, and one gradient per tensor the loss saved of its own (cross-entropy's
    log-softmax output); 0 for other nodes."""
    if node.op != "loss":
        return 0.0
    inputs = [p for p in structure.preds[node.name] if "float" in p.output_dtype]
    kw = dict(precision=precision, dtypes=dtypes)
    # a loss computing in another dtype than its input (fp32 on bf16 logits under autocast) makes the
    # input's gradient in its own dtype first, then casts it back (compute/dtypes.py recast_bytes)
    recast = sum(dtypes.recast_bytes(p, node) for p in inputs) if dtypes is not None else 0.0
    return input_bytes_of(inputs, **kw) + recast + saved_activation_bytes(node, gpu=gpu, **kw)


def _input_bytes(
    structure: BlockStructure, ctx: TPContext, dtypes: RunDtypes | None, nodes: tuple[OpNode, ...] | None = None
) -> float:
    """The outputs of ``nodes`` (the block's inputs when None) per micro-batch on one rank, each in its run dtype."""
    shard = ctx.tp if ctx.sequence_parallel and ctx.tp > 1 else 1
    nodes = structure.inputs if nodes is None else nodes
    f, precision = ctx.batch_fraction, ctx.precision
    return sum(n.output_bytes * f * activation_scale(n, precision=precision, dtypes=dtypes) for n in nodes) / shard


def _params(
    graph: Graph, nodes: tuple[OpNode, ...], param_shard: dict[str, int], whole_bias: frozenset[str] = frozenset()
) -> tuple[dict[str, float], float]:
    """Unique parameters of the nodes (a tied weight counts once), each divided by its tp shard
    (a rowwise linear's bias is whole: it is added after the all-reduce): (elements per name,
    total elements including parameters the trace could not name)."""
    seen: dict[str, float] = {}
    loose = 0.0
    for node in nodes:
        shard = param_shard.get(node.name, 1)
        if node.param_names:
            for name in node.param_names:
                info = graph.parameters.get(name)
                way = 1 if node.name in whole_bias and name.endswith("bias") else shard
                seen.setdefault(name, (info.numel if info else node.param_count / len(node.param_names)) / way)
        elif node.op in PARAM_KINDS or node.param_count:
            loose += node.param_count / shard
    return seen, sum(seen.values()) + loose


def per_distinct(blocks: list, price: Callable[[Any], float]) -> list[float]:
    """``[price(b) for b in blocks]``, calling ``price`` once per distinct object of ``blocks``: a group's
    identical blocks share one summary (CostModel.block_summary), and ``price`` reads nothing but the block."""
    prices: dict[int, float] = {}
    out = []
    for block in blocks:
        hit = prices.get(id(block))  # every block is alive for the whole call: its id is not reused
        if hit is None:
            hit = prices[id(block)] = price(block)
        out.append(hit)
    return out
