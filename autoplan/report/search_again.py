"""The search a plan came from, run again with one more pin: what explain compares the chosen plan
against (without cp, without offload, at FP8). The plan records its search's options
(``Plan.predicted.search``: batch, --fix, objective, --allow-lossy, --allow-fp8) and its runtime."""

from __future__ import annotations

from typing import Any

from autoplan.types.graph import Graph
from autoplan.types.plan import Plan
from autoplan.types.profile import Profile


def search_again(best: Plan, searched: Any, *, graph: Graph, profile: Profile, pin: dict, allow_fp8: bool = True):
    """``plan_graph`` with ``best``'s recorded search options (``searched``) and ``pin`` added to its
    fixes; NoPlanFits when nothing fits. ``allow_fp8=False`` leaves the search's --allow-fp8 out."""
    from autoplan.solve.api import plan_graph  # report/ is imported by the CLI parser: no solver yet

    return plan_graph(
        graph,
        devices=best.devices,
        profile=profile,
        batch_size=searched.batch_size or best.global_batch_size,
        fix={**searched.fixes, **pin},
        objective=searched.objective,
        allow_lossy=searched.allow_lossy,
        allow_fp8=searched.allow_fp8 and allow_fp8,
        runtime=best.runtime,
    )


def without_fits(best: Plan, searched: Any, *, graph: Graph, profile: Profile, pin: dict, what: str, digits: int):
    """``search_again`` with ``pin``: its result, or, where nothing fits, the sentence that says so
    (``what``: "without offload", ...): the most frugal plan it priced, its peak and how far over the usable
    memory, in GiB to ``digits`` decimals. Returns (result, None) or (None, sentence)."""
    from autoplan.cost import usable_bytes
    from autoplan.solve.api import NoPlanFits

    try:
        return search_again(best, searched, graph=graph, profile=profile, pin=pin), None
    except NoPlanFits as failed:
        priced = [c for c in (failed.result.candidates if failed.result else []) if c.cost is not None]
        if not priced:
            return None, f"{what} no plan fits in device memory"
        frugal = min(priced, key=lambda c: c.cost.peak_memory_bytes)
        need, usable, gib = frugal.cost.peak_memory_bytes, usable_bytes(profile.device.memory_bytes), 2**30
        return None, (
            f"{what} no plan fits: the most frugal ({frugal.plan.describe()}) needs {need / gib:.{digits}f} GiB per "
            f"device, {(need - usable) / gib:.{digits}f} GiB more than the {usable / gib:.{digits}f} GiB usable"
        )
