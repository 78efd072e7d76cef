"""FLOPs a plan's recompute re-runs per sample: the hardware FLOPs beyond the model's.

    F_rc = sum over recomputed blocks b of F_fwd(b)                          (full)
         = sum over recomputed blocks b of F_fwd(nodes of b not in SAVED_KINDS)   (selective)

per sample (the graph's FLOPs over its batch), where the recomputed blocks are every block, or the
first k of each pipeline chunk under a budget (autoplan/types/recompute.py). Selective recompute
keeps the outputs of matmuls, attention and convolutions (autoplan/types/saved_ops.py) and re-runs
everything else (cost/blocks.py); docs/cost-model.md, "Budgeted recompute".
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from autoplan.types.graph import Graph
from autoplan.types.plan import Plan
from autoplan.types.recompute import recomputed_blocks
from autoplan.types.saved_ops import SAVED_KINDS

MODES = ("none", "selective", "full")


class RecomputeFlops:
    """Per block and recompute mode, the FLOPs it re-runs per sample (module docstring), computed once."""

    def __init__(self, graph: Graph, nodes_of: dict[str, Sequence]):
        """``nodes_of`` maps each block to the nodes of its group's representative (identical blocks
        re-run identical FLOPs)."""
        self._per_block = {mode: _per_block(graph, nodes_of, mode) for mode in MODES}

    def per_sample(self, plan: Plan, chunks_of: Callable[[Plan], list[list[str]]]) -> float:
        """FLOPs ``plan`` re-runs per sample; ``chunks_of(plan)``, its pipeline chunks, name the blocks a
        budget covers (asked only under one)."""
        per_block = self._per_block[plan.recompute]
        if not plan.recompute_blocks:
            return sum(per_block.values())
        chunks = chunks_of(plan)
        rerun = recomputed_blocks(recompute=plan.recompute, recompute_blocks=plan.recompute_blocks, chunks=chunks)
        return sum(per_block[layer] for layer in rerun)


def _per_block(graph: Graph, nodes_of: dict[str, Sequence], mode: str) -> dict[str, float]:
    if mode == "none":
        return dict.fromkeys(graph.layers, 0.0)
    per_block = {}
    for layer in graph.layers:
        nodes = nodes_of[layer]
        chosen = nodes if mode == "full" else [n for n in nodes if n.op not in SAVED_KINDS]
        per_block[layer] = sum(n.fwd_flops for n in chosen) / graph.batch_size
    return per_block
