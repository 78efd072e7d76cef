"""Activation memory that tensor-parallel resharding adds to what the single-device trace saves
(docs/cost-model.md, "Memory"). Three DTensor copies (autoplan/execute/tensor_parallel.py) are kept
for the backward beside what the trace saw, measured by the execution audit:

- a *gathered colwise* linear ``u`` (a fused qkv split before its view into heads): its consumers'
  views of the gathered output keep the local shard alive: ``+ |out(u)| / tp``;
- a *rowwise* ``v`` whose input is replicated because it descends from a gathered origin saves its
  local ``Shard(-1)`` chunk: ``+ |in(v)| / tp``;
- under *sequence parallelism*, a stream tensor all-gathered for parameterised consumers is saved
  whole: ``+ |src| (1 - 1/tp)`` (Megatron-LM re-gathers it in the backward instead, Korthikanti et
  al. 2022 section 4.2.2).

Bytes are for the whole traced batch in the run's dtypes (compute/dtypes.py), like
``autoplan.cost.compute.roofline.saved_activation_bytes``; callers scale by the micro-batch fraction.
"""

from __future__ import annotations

from autoplan.cost.compute.dtypes import RunDtypes
from autoplan.cost.compute.roofline import activation_scale
from autoplan.cost.tp.block import BlockAnalysis, predecessors
from autoplan.types.graph import Graph


def param_copy_bytes(
    graph: Graph,
    block: BlockAnalysis,
    name: str,
    split: str,
    *,
    tp: int,
    precision: str,
    dtypes: RunDtypes | None = None,
) -> float:
    """The resharded copies parameterised node ``name`` keeps under ``split`` (module docstring)."""
    if tp <= 1:
        return 0.0
    if split == "colwise" and name in block.gathered:
        node = graph.node(name)
        return node.output_bytes * activation_scale(node, precision=precision, dtypes=dtypes) / tp
    if split == "rowwise":
        src = _activation_input(graph, name)
        if src is not None and _from_gathered(block, src):
            node = graph.node(src)
            return node.output_bytes * activation_scale(node, precision=precision, dtypes=dtypes) / tp
    return 0.0


def stream_copy_bytes(
    graph: Graph,
    block: BlockAnalysis,
    *,
    tp: int,
    sequence_parallel: bool,
    precision: str,
    dtypes: RunDtypes | None = None,
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
            scale = activation_scale(graph.node(src), precision=precision, dtypes=dtypes)
            extra = traced_bytes * scale * (1.0 - 1.0 / tp)
            found[consumers[0]] = found.get(consumers[0], 0.0) + extra
    return found


def _activation_input(graph: Graph, name: str) -> str | None:
    """The input the node computes on: its largest predecessor (tp_block._record_input's rule)."""
    inputs = predecessors(graph, name)
    return max(inputs, key=lambda p: graph.node(p).output_bytes) if inputs else None


def _from_gathered(block: BlockAnalysis, src: str) -> bool:
    return src in block.gathered or bool(block.origins.get(src, frozenset()) & block.gathered)
