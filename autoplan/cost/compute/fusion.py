"""Element-wise ops as a compiled block runs them: fused regions (docs/cost-model.md, "Compiled blocks").

TorchInductor fuses pointwise ops with the reductions beside them (norms, softmax) into one kernel,
reading each input once and writing only what leaves it (torch/_inductor/scheduler.py, ``can_fuse``);
torchtitan compiles each TransformerBlock for this, and Transformer Engine's fused norm/activation/
cast kernels do the same for Megatron-Core. Under :func:`fuses_elementwise` (``Plan.compile``, async
TP's compiled blocks, or a runtime with ``fused_elementwise``) a *region* is a maximal connected set
of ``elementwise``, ``norm`` and ``reduction`` nodes of one block, views passing through, that no
path leaves and re-enters (a GEMM, attention, collective, the block's edge or an op outside every
block ends it). With ``I`` the bytes of its external inputs (each read once) and ``O`` those of its
external outputs (read outside the region, or by nothing):

    bytes_fwd(region) = I + O                  (+ a dropout's mask, as eager)
    bytes_bwd(region) = O + 2 I                (read dO and the inputs, write dI: eager's per-op rule)
    launches(region)  = 1 forward, 1 backward  (eager: one per op)

Each read is charged to the first member (graph order) that reads it and each write to the member
that makes it, so a member is priced at its own tp shard; FLOPs stay per member. Saved-activation
memory is as eager (the min-cut partitioner's choices are not modelled). The audit counts the
forward kernels inductor generated against the regions (execute/compiled.py, execute/job/audit.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from autoplan.cost.compute.dtypes import RunDtypes
from autoplan.cost.compute.roofline import activation_scale, input_bytes_of, mask_bytes
from autoplan.types.graph import Graph, OpNode

#: the op kinds a compiled region fuses (pointwise and reductions), views passing through
FUSIBLE_KINDS = ("elementwise", "norm", "reduction")


@dataclass(frozen=True)
class FusedOp:
    """One member of a fused region: the external inputs charged to it, whether its output leaves
    the region, and whether it carries the region's one launch."""

    reads: tuple[str, ...]
    writes: bool
    launches: bool


def fuses_elementwise(plan) -> bool:
    """Whether ``plan``'s element-wise ops run fused: compiled blocks (``compile``, or async TP's
    compile under ``tp_comm_overlap``), or a runtime whose kernels fuse them."""
    return bool(plan.compile or plan.tp_comm_overlap or plan.runtime_preset.fused_elementwise)


def fused_ops(graph: Graph) -> dict[str, FusedOp]:
    """Every fusible node's :class:`FusedOp` (module docstring), built once per graph and cached
    on it as the graph caches its adjacency."""
    cached = graph.__dict__.get("_fused_ops_cache")
    if cached is None:
        cached = graph.__dict__["_fused_ops_cache"] = _build(graph)
    return cached


def regions(graph: Graph) -> list[list[str]]:
    """The fused regions of ``graph``: each a list of its non-view members in graph order."""
    roots, found = _roots(graph), {}
    for name in fused_ops(graph):
        found.setdefault(roots[name], []).append(name)
    return list(found.values())


def region_count(graph: Graph, layers: list[str] | None = None) -> int:
    """How many fused regions lie in ``layers`` (every block when None): the kernels a compiled
    forward launches for them (the backward launches as many)."""
    chosen = set(graph.layers if layers is None else layers)
    return sum(1 for name, op in fused_ops(graph).items() if op.launches and graph.node(name).layer in chosen)


def _member(node: OpNode) -> bool:
    return node.layer is not None and (node.op in FUSIBLE_KINDS or node.op == "view")


def _roots(graph: Graph) -> dict[str, str]:
    """Each member's region, named by a representative: union-find over the member edges of one
    block that join nodes of equal *depth*, where depth(n) = max over inputs p of depth(p) + [p is
    not a member]. A path that leaves the region and comes back (the residual around an MLP)
    passes a non-member, so its ends differ in depth and stay apart: every region is convex, as a
    kernel must be (it cannot consume what a GEMM makes of its own output)."""
    cached = graph.__dict__.get("_fused_roots_cache")
    if cached is not None:
        return cached
    preds, _ = graph.adjacency()
    members = {n.name for n in graph.nodes if _member(n)}
    depth: dict[str, int] = {}
    for node in graph.nodes:  # graph order is a topological order
        depth[node.name] = max((depth.get(p, 0) + (p not in members) for p in preds[node.name]), default=0)
    parent = {name: name for name in members}

    def find(x: str) -> str:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for src, dst in graph.edges:
        joined = src in parent and dst in parent and depth[src] == depth[dst]
        if joined and graph.node(src).layer == graph.node(dst).layer:
            parent[find(src)] = find(dst)
    cached = graph.__dict__["_fused_roots_cache"] = {name: find(name) for name in parent}
    return cached


def _build(graph: Graph) -> dict[str, FusedOp]:
    roots = _roots(graph)
    preds, succs = graph.adjacency()
    views = {name for name in roots if graph.node(name).op == "view"}
    seen_reads: dict[str, set[str]] = {}  # region -> external inputs already charged
    launched: set[str] = set()
    ops: dict[str, FusedOp] = {}
    for node in graph.nodes:
        if node.name not in roots or node.name in views:
            continue
        root = roots[node.name]
        external = [p for p in _through_views(node.name, preds, views, roots, root) if roots.get(p) != root]
        charged = seen_reads.setdefault(root, set())
        reads = tuple(dict.fromkeys(p for p in external if p not in charged))
        charged.update(reads)
        readers = _through_views(node.name, succs, views, roots, root)
        writes = not readers or any(roots.get(s) != root for s in readers)
        ops[node.name] = FusedOp(reads=reads, writes=writes, launches=root not in launched)
        launched.add(root)
    return ops


def _through_views(
    name: str, step: dict[str, list[str]], views: set[str], roots: dict[str, str], root: str
) -> list[str]:
    """The neighbours of ``name`` along ``step``, looking through the region's own views."""
    found, stack = [], list(step[name])
    while stack:
        other = stack.pop(0)
        if other in views and roots[other] == root:
            stack.extend(step[other])
        else:
            found.append(other)
    return found


def fused_moved_bytes(
    graph: Graph,
    node: OpNode,
    op: FusedOp,
    *,
    precision: str,
    gpu: bool,
    backward: bool,
    dtypes: RunDtypes | None = None,
) -> float:
    """Activation bytes ``node`` moves as a member of its region, for the traced batch in
    ``precision`` (module docstring): its charged inputs ``r`` and its write ``w``, forward
    ``r + w``, backward ``w + 2 r`` (a dropout reads its mask instead of one ``r``)."""
    read = input_bytes_of([graph.node(p) for p in op.reads], precision=precision, dtypes=dtypes)
    out = node.output_bytes * activation_scale(node, precision=precision, dtypes=dtypes) if op.writes else 0.0
    mask = mask_bytes(node, precision=precision, gpu=gpu, dtypes=dtypes)
    if backward:
        return out + read + (mask if mask else read)
    return read + out + mask
