"""The search space of a model whose embedding tables take sparse gradients (docs/ilp.md, "Sparse
embedding gradients"): only what the executor runs (autoplan/types/sparse_grads.py), i.e. dp under
DDP with ZeRO-0, tp = pp = cp = 1, an fp32 uncompressed reduction and no offload. A pin outside that
is refused in one sentence; without sparse tables the space is unchanged."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from autoplan.errors import PlanError
from autoplan.types.graph import Graph


def sparse_tables(graph: Graph) -> list[str]:
    """The trainable parameters the trace marked ``sparse_grad``, in the model's order."""
    return [name for name, info in graph.parameters.items() if info.sparse_grad and info.trainable]


def _pinned_blockers(fixes: dict) -> list[str]:
    checks = (
        *((fixes.get(axis, 1) > 1, f"{axis}={fixes.get(axis)}") for axis in ("tp", "pp", "cp")),
        (fixes.get("zero", 0) > 0, f"zero={fixes.get('zero')}"),
        (fixes.get("reduce", "fp32") != "fp32", f"reduce={fixes.get('reduce')}"),
        (bool(fixes.get("powersgd")), f"powersgd={fixes.get('powersgd')}"),
        (fixes.get("grad_compression", "none") != "none", f"grad_compression={fixes.get('grad_compression')}"),
        (fixes.get("offload", "none") != "none", f"offload={fixes.get('offload')}"),
    )
    return [text for blocked, text in checks if blocked]


def check_sparse_pins(graph: Graph, fixes: dict) -> None:
    """A pin the executor cannot run beside sparse gradients: one sentence."""
    tables, blockers = sparse_tables(graph), _pinned_blockers(fixes)
    if tables and blockers:
        raise PlanError(
            f"--fix {', '.join(blockers)} cannot run {', '.join(tables)}, whose gradients are sparse (an embedding "
            "read with sparse=True): only DDP syncs them (ZeRO-0, tp=pp=cp=1, fp32 uncompressed); drop the pin, or "
            "read the tables with sparse=False."
        )


def keep_degrees(degrees: list[Any], tables: list[str]) -> list[Any]:
    """The (dp, tp, pp, cp) shapes that run ``tables``' sparse gradients: all of them when there are none."""
    return [d for d in degrees if not tables or d.tp == d.pp == d.cp == 1]


def keep_dp_choices(choices: list[tuple[int, Any]], tables: list[str]) -> list[tuple[int, Any]]:
    """The (ZeRO stage, GradSync) choices that run ``tables``' sparse gradients (module docstring)."""
    if not tables:
        return choices
    return [
        (zero, grads)
        for zero, grads in choices
        if zero == 0 and grads.compression == "none" and grads.reduce_dtype == "fp32" and grads.offload == "none"
    ]


def with_touched_rows(graph: Graph, rows: int | None) -> Graph:
    """``graph`` with ``--touched-rows`` on each sparse table (None: unchanged); one sentence when it cannot apply."""
    if rows is None:
        return graph
    tables = sparse_tables(graph)
    if rows < 1:
        raise PlanError(f"--touched-rows {rows}: expected a number of rows >= 1.")
    if not tables:
        raise PlanError(
            f"--touched-rows prices sparse embedding gradients, and {graph.model_name} has no table read with "
            "sparse=True; drop it."
        )
    params = {
        name: replace(info, touched_rows=rows) if name in tables else info for name, info in graph.parameters.items()
    }
    return replace(graph, parameters=params)
