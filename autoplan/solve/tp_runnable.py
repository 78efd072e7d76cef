"""Whether the executor can run a model under tensor parallelism at all.

Under ``tp > 1`` every op that touches a parameter, or an activation computed from one, runs
on DTensors (autoplan/execute/tensor_parallel.py), whatever ``tp_plan`` splits; an op DTensor
has no strategy for fails the run in every rank. The trace records such ops on each node as
``attrs["dtensor_lacks"]`` (autoplan/trace/dtensor_reach.py), so the search offers and prices
only ``tp = 1`` for such a model, and a ``--fix tp=N`` pin gets one sentence naming the ops.
"""

from __future__ import annotations

from autoplan.errors import PlanError
from autoplan.types.graph import Graph


def tp_blockers(graph: Graph) -> dict[str, list[str]]:
    """'module (ModuleType)' -> the ops in it DTensor cannot run, in graph order."""
    found: dict[str, list[str]] = {}
    for node in graph.nodes:
        lacks = node.attrs.get("dtensor_lacks", ())
        if lacks:
            where = f"'{node.module or node.name}' ({node.attrs.get('module_type') or node.target})"
            found.setdefault(where, []).extend(op for op in lacks if op not in found.get(where, []))
    return found


def max_tp(graph: Graph, fixes: dict) -> int | None:
    """1 when some op cannot run on DTensors, else None (the model's ops set no limit); a pin
    ``tp > 1`` on such a model raises PlanError with one sentence."""
    blockers = tp_blockers(graph)
    if not blockers:
        return None
    if fixes.get("tp", 1) > 1:
        where, ops = next(iter(blockers.items()))
        more = f" and {len(blockers) - 1} more module(s)" if len(blockers) > 1 else ""
        raise PlanError(
            f"--fix tp={fixes['tp']} cannot run on this model: tensor parallelism runs every op on DTensors, and "
            f"DTensor has no sharding strategy for {', '.join(ops)} in module {where}{more}; use tp=1."
        )
    return 1
