"""Attention written as eager ops, found by its structure, and the one fused kernel that replaces it
(the discussion: docs/cost-model.md, "Fused attention").

An eager attention (HF ``attn_implementation="eager"``, examples/gpt_megatron.py) is the subgraph

    S = matmul(Q, K^T) -> scale / mask / sinks ... -> softmax -> slice / dropout / cast ... -> matmul(P, V)

found from a softmax whose output is 3-D or more (``[..., q, k]``): back through the nodes of the
same leading dims ``[..., q]`` to the activation matmul QK that wrote ``[..., q, k]``, forward to the
activation matmul PV that reads it and writes ``[..., q, d]``. The subgraph is QK, PV and every node
both downstream of QK and upstream of PV; it qualifies when none of its inner nodes is a weighted or
tensor-core op and none is read outside it (returned attention weights keep the scores alive; a
reader nothing reads, a metadata assert or unused max indices, joins the subgraph).

A runtime with ``fused_attention`` (Megatron-Core/TE, torchtitan: types/runtime.py) runs its own
attention module: one attention node priced as the fused kernel (types/attention.py), with
FLOPs QK + PV (model FLOPs unchanged), the Q K^T recomputed in the backward, heads ``h`` from the
scores, KV heads the fewest heads the K operand had before its repeat (GQA), and saved bytes O plus
the fp32 log-sum-exp per query and head (FA2 section 3.1). A mask added to the scores (an input from
outside the subgraph) is a decoder's causal mask, which the runtime's module runs as ``is_causal``
(Megatron's ``AttnMaskType.causal``); with none the kernel is priced unmasked. A sliding window is
data in the mask, so the tracer reads it from the attention's module (QK's ``window``, trace/windows.py);
sinks add one column to the softmax and no tiles.
Likewise an SDPA given a mask computed from positions alone (HF's traced causal mask) runs causal there.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

from autoplan.types.graph import Graph, OpNode, reachable
from autoplan.types.profile import Profile
from autoplan.types.runtime import runtime_named

#: ops that can sit between the two matmuls of an eager attention (no weights, no tensor cores)
_INNER_OPS = ("elementwise", "view", "reduction", "other")
LSE_BYTES = 4  # FA2/FA3 keep one fp32 log-sum-exp per query row and head for the backward


@dataclass(frozen=True)
class EagerAttention:
    """One eager attention subgraph: its two matmuls, every node in it, and whether its scores are masked."""

    qk: str
    pv: str
    nodes: frozenset[str]
    masked: bool


def find_eager_attention(graph: Graph) -> list[EagerAttention]:
    """Every eager attention subgraph of ``graph`` (module docstring), in graph order."""
    found, claimed = [], set()
    for node in graph.nodes:
        if "softmax" not in node.target.lower() or len(node.output_shape) < 3 or node.name in claimed:
            continue
        match = _match(graph, node)
        if match is not None:
            found.append(match)
            claimed |= match.nodes
    return found


def _match(graph: Graph, softmax: OpNode) -> EagerAttention | None:
    preds, succs = graph.adjacency()
    rows = softmax.output_shape[:-1]
    qk = _walk(graph, softmax.name, preds, rows, want=lambda n: n.output_shape[:-1] == rows)
    pv = _walk(graph, softmax.name, succs, rows, want=lambda n: n.output_shape[:-1] == rows)
    if qk is None or pv is None or qk == pv:
        return None
    inner = (reachable({qk}, succs) & reachable({pv}, preds)) - {qk, pv}
    if any(graph.node(name).op not in _INNER_OPS for name in inner):
        return None
    readers = {s for name in inner | {qk} for s in succs[name]} - inner - {pv}
    dead = {r for r in readers if not succs[r] and graph.node(r).op != "output"}  # asserts, unused max indices
    if readers - dead:
        return None  # the scores or probabilities are read outside: they must be materialised
    nodes = frozenset(inner | dead | {qk, pv})
    masked = any(p not in nodes and _is_activation(graph, p, preds) for name in inner for p in preds[name])
    return EagerAttention(qk=qk, pv=pv, nodes=nodes, masked=masked)


def _walk(graph: Graph, start: str, step: dict, rows: list[int], *, want) -> str | None:
    """The nearest activation matmul reached from ``start`` along ``step`` through inner ops of the same rows."""
    frontier, seen = [start], {start}
    while frontier:
        nxt = []
        for name in frontier:
            for other in step[name]:
                node = graph.node(other)
                if other in seen or node.output_shape[: len(rows)] != rows:
                    continue
                seen.add(other)
                if node.op == "matmul" and want(node):
                    return other
                if node.op in _INNER_OPS:
                    nxt.append(other)
        frontier = nxt
    return None


def _is_activation(graph: Graph, name: str, preds: dict) -> bool:
    """A tensor computed from the inputs (a mask), not a parameter path (GPT-OSS's sinks)."""
    holders = {p for p in reachable({name}, preds) | {name} if graph.node(p).param_count > 0}
    return not holders


def fused_attention_graph(graph: Graph) -> Graph | None:
    """``graph`` with each eager attention replaced by one fused attention node (module docstring);
    None when it has none."""
    found = find_eager_attention(graph)
    if not found:
        return None
    removed, fused = set(), {}
    for match in found:
        removed |= match.nodes - {match.pv}
        fused[match.pv] = _fused_node(graph, match)
    preds, _ = graph.adjacency()
    edges = [(s, d) for s, d in graph.edges if s not in removed and d not in removed and d not in fused]
    for match in found:
        reads = [p for name in (match.qk, match.pv) for p in preds[name] if p not in match.nodes]
        edges += [(p, match.pv) for p in dict.fromkeys(reads)]
    nodes = [fused.get(n.name, n) for n in graph.nodes if n.name not in removed]
    return replace(graph, nodes=nodes, edges=edges)


def _fused_node(graph: Graph, match: EagerAttention) -> OpNode:
    qk, pv = graph.node(match.qk), graph.node(match.pv)
    *lead, q_len, kv_len = qk.output_shape
    heads = lead[-1] if lead else 1
    attrs = {
        "num_heads": heads,
        "num_kv_heads": _kv_heads(graph, match, heads),
        "head_dim": pv.output_shape[-1],
        "q_len": q_len,
        "kv_len": kv_len,
        "causal": match.masked,
        "has_mask": False,
        "window": int(qk.attrs.get("window") or 0),  # the module's sliding window (trace/windows.py)
        "bwd_recompute_flops": qk.fwd_flops,
        "eager_nodes": len(match.nodes),
    }
    lse_bytes = LSE_BYTES * math.prod(lead) * q_len
    return replace(
        pv,
        op="attention",
        target="fused_attention",
        saved_bytes=pv.output_bytes + lse_bytes,
        fwd_flops=qk.fwd_flops + pv.fwd_flops,
        bwd_flops=qk.bwd_flops + pv.bwd_flops,
        attrs=attrs,
    )


def _kv_heads(graph: Graph, match: EagerAttention, heads: int) -> int:
    """The fewest heads (dim 1 of a 4-D tensor) on QK's operand paths through views: K before GQA's repeat."""
    preds, _ = graph.adjacency()
    counts, stack, seen = [heads], [p for p in preds[match.qk] if p not in match.nodes], set()
    while stack:
        node = graph.node(stack.pop())
        if node.name in seen:
            continue
        seen.add(node.name)
        if len(node.output_shape) == 4 and node.output_shape[1] > 0 and heads % node.output_shape[1] == 0:
            counts.append(node.output_shape[1])
        if node.op == "view":
            stack += preds[node.name]
    return min(counts)


class FusedAttentionModel:
    """A cost model of ``graph`` as a runtime's own attention runs it: each eager attention fused when the
    runtime has ``fused_attention``, every attention node marked with the runtime's ``attention_kernel``
    (attrs ``kernel``, read by cost/compute/roofline.py); built with ``build(graph, profile)`` on first use."""

    def __init__(self, graph: Graph, profile: Profile, *, build: Callable):
        self.graph, self.profile, self._build = graph, profile, build
        self._models: dict[tuple[bool, str, bool], object] = {}

    def for_runtime(self, runtime: str):
        """The cost model for ``runtime``; None when it runs the graph as traced (no fusion, SDPA's kernel)."""
        preset = runtime_named(runtime)
        return self._model(fuse=preset.fused_attention, kernel=preset.attention_kernel)

    def eager_fused(self):
        """The graph with its eager attentions run as SDPA, nothing else changed; None when it has none."""
        return self._model(fuse=True, kernel="sdpa", own_module=False)

    def _model(self, *, fuse: bool, kernel: str, own_module: bool = True):
        """``own_module``: the runtime brings its attention module, so a positional mask runs causal."""
        key = (fuse, kernel, own_module)
        if key not in self._models:
            graph = _rewritten(self.graph, fuse=fuse, kernel=kernel, own_module=own_module)
            self._models[key] = self._build(graph, self.profile) if graph is not self.graph else None
        return self._models[key]


def _rewritten(graph: Graph, *, fuse: bool, kernel: str, own_module: bool) -> Graph:
    """Eager attention fused (``fuse``), positional masks causal (``own_module``), attention nodes run by
    ``kernel``; ``graph`` itself when nothing changes, so a rewritten graph rewrites to itself (the search
    builds its CostModel on one, CostModel.for_runtime)."""
    rewritten = (fused_attention_graph(graph) if fuse else None) or graph
    rewritten = with_causal_masks(rewritten) if fuse and own_module else rewritten
    return with_kernel(rewritten, kernel) if kernel != "sdpa" else rewritten


def with_causal_masks(graph: Graph) -> Graph:
    """``graph`` with each SDPA whose explicit mask is computed from positions alone (no input, no weight
    upstream: HF's traced causal mask) run causal, as a runtime's own attention module runs a decoder's
    (Megatron's ``AttnMaskType.causal``, torchtitan's ``is_causal``); itself when there is none."""
    preds, _ = graph.adjacency()
    structural = {
        n.name
        for n in graph.nodes
        if n.op == "attention" and n.attrs.get("has_mask") and any(_positional(graph, p, preds) for p in preds[n.name])
    }
    if not structural:
        return graph
    causal = {"causal": True, "has_mask": False, "mask": "positional"}
    nodes = [replace(n, attrs={**n.attrs, **causal}) if n.name in structural else n for n in graph.nodes]
    return replace(graph, nodes=nodes)


def _positional(graph: Graph, name: str, preds: dict) -> bool:
    """A tensor computed from positions alone: no graph input and no weight upstream of it."""
    upstream = reachable({name}, preds) | {name}
    return all(graph.node(u).op != "input" and graph.node(u).param_count == 0 for u in upstream)


def with_kernel(graph: Graph, kernel: str) -> Graph:
    """``graph`` with every attention node run by ``kernel`` (attrs ``kernel``); itself when they all are."""
    if all(n.attrs.get("kernel") == kernel for n in graph.nodes if n.op == "attention"):
        return graph
    nodes = [replace(n, attrs={**n.attrs, "kernel": kernel}) if n.op == "attention" else n for n in graph.nodes]
    return replace(graph, nodes=nodes)
