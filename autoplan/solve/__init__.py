"""The planner: legal per-op splits -> intra-op ILP per block group -> pipeline partition DP ->
outer search over dp x tp x pp, micro-batches, schedules, ZeRO, recomputation, sequence
parallelism and precision, every candidate priced by the cost model. See docs/ilp.md.

``plan(model, example_inputs, devices=..., profile=..., batch_size=...) -> Plan`` traces and
searches; ``plan_graph(graph, ...)`` searches an already traced graph and returns every candidate;
``sweep(model, devices=..., profiles=[...], batch_size=..., tokens=...)`` plans across cluster
sizes and instances and recommends what to rent (solve/cluster.py).
They are imported lazily, so the CLI starts without PuLP.
"""

from __future__ import annotations

from typing import Any

__all__ = ["plan", "plan_graph", "NoPlanFits", "sweep", "sweep_graph"]


def __getattr__(name: str) -> Any:
    if name in ("sweep", "sweep_graph"):
        from autoplan.solve import cluster

        return getattr(cluster, name)
    if name in __all__:
        from autoplan.solve import api

        return getattr(api, name)
    raise AttributeError(f"module 'autoplan.solve' has no attribute '{name}'")
