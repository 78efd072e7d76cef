"""Why the chosen plan offloads, in one sentence (``autoplan explain``; docs/cost-model.md, "Offload").

Against the next cheaper option, the same search pinned to ``offload=none`` (as report/explain.py's
``cp_why`` asks the planner again at cp = 1): when nothing fits without offload, by how many GiB the most
frugal plan misses the usable memory; otherwise what the offloaded plan gains over the best plan without it.
Then what the host step costs per step: the copies over the host link and the CPU Adam step
(cost/memory/offload.py, ``Cost.extra["offload"]``), and the host memory held.
"""

from __future__ import annotations

from autoplan.display import duration_text, trade_text
from autoplan.report.search_again import without_fits
from autoplan.types.graph import Graph
from autoplan.types.profile import Profile

GIB = 2**30


def offload_why(result, *, graph: Graph, profile: Profile) -> str:
    """One sentence (module docstring); '' when the chosen plan does not offload."""
    best, cost = result.best, result.best_cost
    searched = best.predicted.search if best is not None and best.predicted else None
    if best is None or best.offload == "none" or searched is None:
        return ""
    paid = cost.extra.get("offload", {})
    what = "the fp32 master weights and Adam state" if best.offload == "optimizer" else "every model state"
    host = (
        f"offload={best.offload} keeps {what} on the host ({paid.get('host_bytes', 0) / GIB:.1f} GiB per device) "
        f"and pays {duration_text(cost.optimizer_s)} per step for it ({duration_text(paid.get('copy_s', 0.0))} "
        f"of copies over the host link, {duration_text(paid.get('adam_s', 0.0))} of CPU Adam) in a step of "
        f"{duration_text(cost.step_time_s)}"
    )
    return f"{host}; {_without(best, searched, graph=graph, profile=profile, cost=cost)}."


def _without(best, searched, *, graph: Graph, profile: Profile, cost) -> str:
    """The next cheaper option, offload=none: why it does not fit, or what it would cost."""
    pin = {"offload": "none"}
    flat, said = without_fits(best, searched, graph=graph, profile=profile, pin=pin, what="without offload", digits=1)
    if flat is None:
        return said
    rival = flat.best_cost
    gap_s = rival.step_time_s - cost.step_time_s  # a pin may offload where the plan without it is faster
    trade = trade_text(gap_s, verb="buys")
    return (
        f"the best plan without offload ({flat.best.describe()}) fits in {rival.peak_memory_bytes / GIB:.1f} GiB "
        f"against {cost.peak_memory_bytes / GIB:.1f} GiB and steps in {duration_text(rival.step_time_s)}, so the "
        f"memory offload frees {trade} per step"
    )
