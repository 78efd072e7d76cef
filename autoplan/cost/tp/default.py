"""Megatron-LM's tensor-parallel plan for any graph, where its splits are legal.

Shoeybi et al. 2019 section 3: vocabulary-parallel embeddings, a colwise linear where the
residual stream feeds it, a rowwise linear where colwise ones feed it (so the pair needs one
all-reduce, or a reduce-scatter under sequence parallelism), and, with sequence parallelism,
norms on the sequence shard. This is what an empty ``tp_plan`` at tp > 1 means, to the cost
model and the executor alike (autoplan/execute/api.with_default_tp_plan).
"""

from __future__ import annotations

from autoplan.cost.tp.block import BlockAnalysis, analyse_block
from autoplan.cost.tp.splits import legal_splits
from autoplan.types.graph import Graph


def default_tp_plan(graph: Graph, tp: int, *, sequence_parallel: bool = False) -> dict[str, str]:
    """Megatron's plan where legal: vocab-parallel embeddings, colwise on linears fed by the
    stream, rowwise on linears fed by colwise ones, sequence-parallel norms under SP."""
    plan: dict[str, str] = {}
    if tp <= 1:
        return plan
    for layer in [None] + list(graph.layers):
        block = analyse_block(graph, layer)
        chosen: dict[str, str] = {}
        for v in block.params:
            chosen[v] = _megatron_split(graph, block, v, chosen, tp)
            plan.setdefault(graph.node(v).module, chosen[v])
        if sequence_parallel:
            for node in block.nodes:
                # an MoE block's nodes take no split: it runs whole on the rank's tokens (tp_block.token_wise_nodes)
                if "sequence_parallel" in legal_splits(node, tp) and node.module and node.name not in block.token_wise:
                    plan.setdefault(node.module, "sequence_parallel")
    return {module: split for module, split in plan.items() if split != "replicate"}


def _megatron_split(graph: Graph, block: BlockAnalysis, v: str, chosen: dict[str, str], tp: int) -> str:
    legal = legal_splits(graph.node(v), tp)
    if graph.node(v).op == "embedding":
        return "rowwise" if "rowwise" in legal else "replicate"
    fed = {u for (u, w) in block.edges if w == v}
    if fed and all(chosen.get(u) == "colwise" for u in fed):
        return "rowwise" if "rowwise" in legal else "replicate"
    return "colwise" if "colwise" in legal else "replicate"
