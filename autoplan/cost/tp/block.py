"""The split-independent structure of one block, for the tensor-parallel cost terms.

Which nodes are parameterised, which "pure" nodes descend only from parameterised origins
through layout-preserving ops, which tensors reach the residual stream, and which fused
linears are priced as gathered. It depends on the graph alone (not on tp or the splits), so it
is computed once per block and cached on the graph; autoplan/cost/tp/splits.py prices
splits on top of it (its module docstring states the model).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import combinations

from autoplan.cost.compute.roofline import activation_scale
from autoplan.types.graph import PARAM_KINDS, Graph, OpNode

PRESERVING = ("elementwise", "view", "matmul", "attention")
STREAM_KINDS = ("norm", "elementwise", "view")
OUTPUT_KINDS = ("output", "loss")  # a sink into these is the model's output, gathered whole (not the stream)


def is_gathered(node: OpNode) -> bool:
    """A fused linear whose colwise shard is not whole heads per rank: its output is split into
    parts along the features before any view into heads (nanoGPT's [q | k | v]), or unflattened
    with the parts outermost ([3, heads, head_dim]). A head-major layout ([heads, 3*head_dim],
    Megatron's head-interleaved qkv) keeps every rank's q, k and v of the same heads."""
    parts, head_split = node.attrs.get("fused_chunks"), node.attrs.get("head_split")
    head_major = bool(head_split) and (len(head_split) == 2 or head_split[0] != parts)
    return bool(parts) and not head_major


# ---- block structure (split-independent, cached on the graph) ----------------------------
@dataclass
class BlockAnalysis:
    """What the graph says about one block, independent of tp and of the splits."""

    nodes: list[OpNode]
    params: list[str]  # parameterised nodes, in order
    origins: dict[str, frozenset[str]]  # pure node -> its parameterised origins
    gathered: frozenset[str] = frozenset()  # fused linears: colwise output is all-gathered
    sinks: dict[str, float] = field(default_factory=dict)  # origin -> output bytes reaching the stream
    output_sinks: set[str] = field(default_factory=set)  # origins whose every sink is the model output
    has_targets: set[str] = field(default_factory=set)  # origins feeding another param node
    edges: dict[tuple[str, str], float] = field(default_factory=dict)  # (u, v) -> bytes
    siblings: dict[tuple[str, str], tuple[float, float]] = field(default_factory=dict)
    sources: dict[str, tuple[float, list[str], bool, bool]] = field(default_factory=dict)
    # stream tensor -> (bytes, consumers, needs grad, sequence-shardable)
    edge_tensors: dict[tuple[str, str], str] = field(default_factory=dict)  # (u, v) -> the tensor v reads
    token_wise: frozenset[str] = frozenset()  # nodes of MoE blocks: run whole on the rank's tokens (token_wise_nodes)


def analyse_block(graph: Graph, layer: str | None) -> BlockAnalysis:
    """The split-independent structure of block ``layer``; cached on the graph."""
    cache = graph.__dict__.setdefault("_tp_analysis_cache", {})
    if layer not in cache:
        cache[layer] = _analyse(graph, layer)
    return cache[layer]


def predecessors(graph: Graph, name: str) -> list[str]:
    """The nodes whose outputs ``name`` reads, in edge order (as autoplan/cost/blocks.py reads them)."""
    return graph.adjacency()[0][name]


#: the nodes outside every block that run before the first block (pipeline stage 0) and after it (the last stage)
OUTSIDE_PARTS = ("@pre", "@post")


def block_nodes(graph: Graph, layer: str | None) -> list[OpNode]:
    """The nodes of block ``layer``; None: every node outside the blocks; "@pre"/"@post": those
    before the first block's first node and the rest (docs/architecture.md)."""
    if layer not in OUTSIDE_PARTS:  # Graph.layer_nodes, from one pass over the graph (cached on it, as below)
        index = graph.__dict__.setdefault("_block_nodes_cache", {})
        if not index:
            for node in graph.nodes:
                index.setdefault(node.layer, []).append(node)
        return list(index.get(layer, ()))
    first = next((i for i, n in enumerate(graph.nodes) if n.layer is not None), len(graph.nodes))
    part = graph.nodes[:first] if layer == "@pre" else graph.nodes[first:]
    return [n for n in part if n.layer is None]


def token_wise_nodes(graph: Graph, nodes: list[OpNode]) -> frozenset[str]:
    """The nodes of ``nodes`` inside a dropless MoE block (``MoELayer.interface`` "grouped": the
    router, its top-k, the experts and any shared expert). Such a block is token-wise: each
    token's output depends on that token alone, so under tensor parallelism it runs whole, with
    replicated weights, on the tokens the rank holds: all of them on the replicated stream, its
    sequence shard under sequence parallelism, where the weights' gradients are partial sums
    (autoplan/execute/expert_sequence.py; Megatron-Core's experts at expert-tensor-parallel size 1).
    Its nodes choose no split and send nothing. A block routing with a fixed capacity is not
    token-wise (the capacity depends on how many tokens it sees) and is not listed."""
    blocks = {moe.module for moe in graph.moe_layers if moe.interface == "grouped"}
    return frozenset(n.name for n in nodes if blocks and _within_any(n.module, blocks))


def _within_any(module: str, prefixes: set[str]) -> bool:
    """``within(module, p)`` for some p of ``prefixes``: the module or one that encloses it is among them
    (a set lookup per enclosing module, not a test per prefix: DeepSeek-V3 has 58 MoE blocks)."""
    if module in prefixes:
        return True
    dot = module.find(".")
    while dot >= 0:
        if module[:dot] in prefixes:
            return True
        dot = module.find(".", dot + 1)
    return False


def _analyse(graph: Graph, layer: str | None) -> BlockAnalysis:
    preds, succs = graph.adjacency()
    nodes = block_nodes(graph, layer)
    inside = {n.name for n in nodes}
    token_wise = token_wise_nodes(graph, nodes)
    params = [n.name for n in nodes if n.op in PARAM_KINDS and n.name not in token_wise]
    gathered = frozenset(n.name for n in nodes if n.op == "linear" and is_gathered(n))
    block = BlockAnalysis(
        nodes=nodes,
        params=params,
        origins=_origins(graph, nodes, preds, set(params)),
        gathered=gathered,
        token_wise=token_wise,
    )
    for u in params:
        _walk_origin(graph, block, u, inside, succs)
    for n, origin_set in block.origins.items():
        _record_siblings(graph, block, n, preds)
    for v in params:
        _record_input(graph, block, v, inside, preds)
    return block


def _origins(
    graph: Graph, nodes: list[OpNode], preds: dict[str, list[str]], params: set[str]
) -> dict[str, frozenset[str]]:
    """Pure preserving nodes and the parameterised nodes they descend from."""
    origins: dict[str, frozenset[str]] = {}
    for node in nodes:
        if node.name in params or node.op not in PRESERVING or not carries_values(node):
            continue
        found: set[str] = set()
        impure = False
        for p in preds[node.name]:
            if p in params:
                found.add(p)
            elif p in origins:
                found |= origins[p]
            elif not _broadcast_side(graph.node(p), node):
                impure = True
        if found and not impure:
            origins[node.name] = frozenset(found)
    return origins


def carries_values(node: OpNode) -> bool:
    """Whether ``node`` outputs a tensor. One that outputs none reads its input's metadata (``x.dtype``,
    ``x.shape``) or checks it (torch.export's ``_assert_tensor_metadata``): a consumer of it, such as the rotary
    tables' ``cos.to(q.dtype)`` (examples/llama.py, Hugging Face's Llama), reads none of the input's values, so
    it neither descends from the input's parameterised origin nor is a sink of it that the origin's shards must
    be gathered for. Reading a DTensor's dtype or shape sends nothing."""
    return bool(node.output_bytes)


def _broadcast_side(source: OpNode, node: OpNode) -> bool:
    """A stream input that only broadcasts into ``node`` (rotary tables, masks, scalars)."""
    return node.op == "attention" or source.output_bytes < node.output_bytes


def _walk_origin(graph: Graph, block: BlockAnalysis, u: str, inside: set[str], succs: dict[str, list[str]]) -> None:
    """Follow ``u``'s output through pure nodes; note the parameterised nodes and sinks it reaches."""
    stack, seen = [u], {u}
    params = set(block.params)
    to_output = to_stream = False
    while stack:
        name = stack.pop()
        consumers = succs[name]
        to_output = to_output or not consumers
        for c in consumers:
            if not carries_values(graph.node(c)):  # x.dtype, x.shape, an assert: none of u's values go on
                continue
            if c in params and c in inside:
                block.has_targets.add(u)
            elif c in block.origins and u in block.origins[c]:
                if c not in seen:
                    seen.add(c)
                    stack.append(c)
            elif graph.node(c).op in OUTPUT_KINDS:
                to_output = True
            else:
                to_stream = True
    if to_output or to_stream:
        block.sinks[u] = float(graph.node(u).output_bytes)
    if to_output and not to_stream:
        block.output_sinks.add(u)


def _record_siblings(graph: Graph, block: BlockAnalysis, n: str, preds: dict[str, list[str]]) -> None:
    sets = [frozenset([p]) if p in block.params else block.origins.get(p, frozenset()) for p in preds[n]]
    sets = [s for s in sets if s]
    for a, b in combinations(sets, 2):
        for u in a:
            for w in b:
                if u != w:
                    key = (u, w) if u < w else (w, u)
                    block.siblings.setdefault(
                        key, (float(graph.node(key[0]).output_bytes), float(graph.node(key[1]).output_bytes))
                    )


def _record_input(graph: Graph, block: BlockAnalysis, v: str, inside: set[str], preds: dict[str, list[str]]) -> None:
    """Classify ``v``'s activation input: from origins (edges) or from the stream (sources)."""
    inputs = preds[v]
    if not inputs:
        return
    src = max(inputs, key=lambda p: graph.node(p).output_bytes)
    node = graph.node(src)
    if src in block.params or src in block.origins:
        origin_set = {src} if src in block.params else block.origins[src]
        for u in origin_set:
            block.edges[(u, v)] = block.edges.get((u, v), 0.0) + node.output_bytes / len(origin_set)
            block.edge_tensors[(u, v)] = src
        return
    floating = activation_scale(node, precision="fp32") != 1.0 or "float" in node.output_dtype
    shardable = floating and (node.op in STREAM_KINDS or src not in inside)
    bytes_, consumers, _, _ = block.sources.get(src, (float(node.output_bytes), [], floating, shardable))
    block.sources[src] = (bytes_, consumers + [v], floating, shardable)
