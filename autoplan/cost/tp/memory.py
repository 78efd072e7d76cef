"""Activation memory that tensor-parallel resharding adds to what the single-device trace saves.

The tracer charges each saved tensor to the node that produced it (autoplan/trace/propagate.py),
and autoplan/cost/tp/splits.py divides that charge by the node's activation shard. The
executor (autoplan/execute/tensor_parallel.py) reshards with DTensor, and three of its copies
are kept for the backward beside what the trace saw, measured by the execution audit
(autoplan/execute/job/audit.py, ``benchmarks/audit.py``):

- *gathered colwise* linear ``u`` (a fused qkv split before its view into heads): the model's
  ``split`` all-gathers the output and its consumers save views of the gathered copy (charged at
  full size by ``param_node_shards``); those views keep their base, the local output shard,
  alive too: ``+ |out(u)| / tp``.
- *rowwise* ``v`` whose input is replicated because it descends from a gathered origin: the
  input is cut to the local ``Shard(-1)`` chunk, a new contiguous tensor, and the linear saves
  that chunk: ``+ |in(v)| / tp``. (A rowwise input replicated because an origin was left
  replicated is the same copy; the intra-op ILP has no term of two splits for memory, so
  neither side charges it, and the default and ILP splits never produce it.)
- under *sequence parallelism*, a stream tensor all-gathered for parameterised consumers (the
  input of qkv, of the MLP's first linears, of the head): the consumers save the gathered whole
  tensor, not the sequence shard, so its charge is ``|src|`` rather than ``|src| / tp``:
  ``+ |src| (1 - 1/tp)``. Megatron-LM instead keeps the shard and all-gathers it again in the
  backward (Korthikanti et al. 2022 section 4.2.2); the executor does not, and neither does the
  comm price.

Bytes are for the whole traced batch in the run's precision, like
``autoplan.cost.compute.roofline.saved_activation_bytes``; callers scale by the micro-batch fraction.
"""

from __future__ import annotations

from autoplan.cost.compute.roofline import activation_scale
from autoplan.cost.tp.block import BlockAnalysis, predecessors
from autoplan.types.graph import Graph


def param_copy_bytes(graph: Graph, block: BlockAnalysis, name: str, split: str, *, tp: int, precision: str) -> float:
    """The resharded copies parameterised node ``name`` keeps under ``split`` (module docstring)."""
    if tp <= 1:
        return 0.0
    if split == "colwise" and name in block.gathered:
        node = graph.node(name)
        return node.output_bytes * activation_scale(node, precision=precision) / tp
    if split == "rowwise":
        src = _activation_input(graph, name)
        if src is not None and _from_gathered(block, src):
            node = graph.node(src)
            return node.output_bytes * activation_scale(node, precision=precision) / tp
    return 0.0


def stream_copy_bytes(
    graph: Graph, block: BlockAnalysis, *, tp: int, sequence_parallel: bool, precision: str
) -> dict[str, float]:
    """The whole copies of the block's sequence-sharded stream tensors that its parameterised
    consumers save under sequence parallelism (module docstring), by the first consumer (they
    are charged where the gather happens, which a pipeline cut never separates from it);
    split-independent."""
    if tp <= 1 or not sequence_parallel:
        return {}
    found: dict[str, float] = {}
    for src, (traced_bytes, consumers, _needs_grad, shardable) in block.sources.items():
        if shardable:
            extra = traced_bytes * activation_scale(graph.node(src), precision=precision) * (1.0 - 1.0 / tp)
            found[consumers[0]] = found.get(consumers[0], 0.0) + extra
    return found


def _activation_input(graph: Graph, name: str) -> str | None:
    """The input the node computes on: its largest predecessor (tp_block._record_input's rule)."""
    inputs = predecessors(graph, name)
    return max(inputs, key=lambda p: graph.node(p).output_bytes) if inputs else None


def _from_gathered(block: BlockAnalysis, src: str) -> bool:
    return src in block.gathered or bool(block.origins.get(src, frozenset()) & block.gathered)
