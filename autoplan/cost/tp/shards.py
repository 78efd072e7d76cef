"""How much of each node one tp rank holds and computes, given the splits of a block.

The layouts are tensor_parallel.py's (module docstring there): a parameterised node's split
fixes its shard (a replicated one is handed its input whole); a *pure* node follows DTensor's
propagation, which slices a replicated operand locally to meet a sharded one and moves a feature
shard to a sequence shard: on sequence shards (Q) when any origin is a rowwise node reduce-scattered
under sequence parallelism, else sharded (S) when any origin is colwise and not gathered, else
replicated (R); every other node is on the residual stream, a sequence shard
under SP for norms, element-wise ops and views (Korthikanti et al. 2022 fig. 5) and for every node
of an MoE block (tp_block.token_wise_nodes), else whole.
CostModel (cost/blocks.py) and the intra-op ILP (solve/intra_op.py) both read these factors.
"""

from __future__ import annotations

from autoplan.cost.tp.block import STREAM_KINDS, BlockAnalysis, analyse_block
from autoplan.types.graph import Graph, OpNode


def reduce_scattered(block: BlockAnalysis, u: str, *, sequence_parallel: bool) -> bool:
    """A rowwise ``u`` whose partial sum goes straight to the stream is reduce-scattered to a
    sequence shard (Q) under SP (Korthikanti et al. 2022 fig. 5); otherwise all-reduced (R)."""
    return sequence_parallel and bool(block.sinks.get(u)) and u not in block.has_targets


SHARD_DIM = {
    ("linear", "colwise"): 0,
    ("linear", "rowwise"): 1,
    ("embedding", "rowwise"): 0,
    ("embedding", "colwise"): 1,
}


def shard_dim(kind: str, split: str) -> int | None:
    """The weight dimension ``split`` shards on an op of ``kind`` (None: not sharded): tied ops must agree."""
    return SHARD_DIM.get((kind, split))


def param_node_shards(
    block: BlockAnalysis, name: str, split: str, *, tp: int, sequence_parallel: bool
) -> tuple[int, int, int]:
    """(compute, param, activation) shard of parameterised node ``name`` under ``split``. Saved
    bytes are charged to the producing node (the tracer's rule), so the activation shard is
    that of the output consumers keep: a colwise output is the S shard, unless it is gathered
    (the full tensor is what its consumers save); a rowwise output is whole after its
    all-reduce, or a sequence shard after a reduce-scatter under SP."""
    if split == "replicate":
        return 1, 1, 1
    if split == "colwise":
        return tp, tp, 1 if name in block.gathered else tp
    return tp, tp, tp if reduce_scattered(block, name, sequence_parallel=sequence_parallel) else 1


def pure_layout(
    block: BlockAnalysis, origins: frozenset[str], splits: dict[str, str], *, sequence_parallel: bool
) -> str:
    """Layout a pure node runs on (module docstring): Q when any origin is a rowwise node
    reduce-scattered under SP, else S when any origin is colwise and not gathered, else R."""
    if any(splits[u] == "rowwise" and reduce_scattered(block, u, sequence_parallel=sequence_parallel) for u in origins):
        return "Q"
    if any(splits[u] == "colwise" and u not in block.gathered for u in origins):
        return "S"
    return "R"


def sharding_origins(
    block: BlockAnalysis, origins: frozenset[str], legal: dict[str, tuple[str, ...]], *, sequence_parallel: bool
) -> dict[str, tuple[str, ...]]:
    """Layout (S, Q) -> the origins whose split (colwise, rowwise) would give a pure node that
    layout (:func:`pure_layout`); a layout no origin can give is left out."""
    found = {
        "S": tuple(u for u in origins if "colwise" in legal[u] and u not in block.gathered),
        "Q": tuple(
            u
            for u in origins
            if "rowwise" in legal[u] and reduce_scattered(block, u, sequence_parallel=sequence_parallel)
        ),
    }
    return {layout: tuple(sorted(us)) for layout, us in found.items() if us}


def pure_layouts_possible(
    block: BlockAnalysis, origins: frozenset[str], legal: dict[str, tuple[str, ...]], *, sequence_parallel: bool
) -> tuple[str, ...]:
    """The layouts :func:`pure_layout` can return for some legal splits of ``origins``."""
    return layouts_of(sharding_origins(block, origins, legal, sequence_parallel=sequence_parallel))


def layouts_of(sharding: dict[str, tuple[str, ...]]) -> tuple[str, ...]:
    """The layouts of a pure node whose :func:`sharding_origins` is ``sharding``: R, and each some origin gives."""
    return ("R", *sharding)


def pure_node_shards(layout: str, *, tp: int) -> tuple[int, int]:
    """(compute, activation) shard of a pure node running on ``layout`` (R, S or Q)."""
    return (1, 1) if layout == "R" else (tp, tp)


def stream_node_shards(node: OpNode, *, tp: int, sequence_parallel: bool, token_wise: bool = False) -> tuple[int, int]:
    """(compute, activation) shard of a node on the residual stream: Q (/tp) under SP for
    norms, element-wise ops and views, and for every node of an MoE block (``token_wise``,
    tp_block.token_wise_nodes: the block runs on the rank's sequence shard), else replicated."""
    way = tp if sequence_parallel and (node.op in STREAM_KINDS or token_wise) else 1
    return way, way


def shards(
    graph: Graph, layer: str | None, splits: dict[str, str], *, tp: int, sequence_parallel: bool
) -> tuple[dict, dict, dict]:
    """(compute_shard, param_shard, activation_shard) per node of the block (module doc)."""
    block = analyse_block(graph, layer)
    compute, param, act = {}, {}, {}
    for node in block.nodes:
        name = node.name
        param[name] = 1
        if name in splits:
            compute[name], param[name], act[name] = param_node_shards(
                block, name, splits[name], tp=tp, sequence_parallel=sequence_parallel
            )
        elif name in block.origins:
            layout = pure_layout(block, block.origins[name], splits, sequence_parallel=sequence_parallel)
            compute[name], act[name] = pure_node_shards(layout, tp=tp)
        else:
            compute[name], act[name] = stream_node_shards(
                node, tp=tp, sequence_parallel=sequence_parallel, token_wise=name in block.token_wise
            )
    return compute, param, act
