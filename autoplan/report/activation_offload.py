"""Why the chosen plan offloads its activations, in one sentence (``autoplan explain``; docs/cost-model.md,
"Activation offload").

What the plan sends to the host (``Cost.extra["activation_offload"]``: the host bytes per device, the copies'
seconds per step, cost/memory/activation_offload.py), against the next option, the same search pinned to
``offload_activations=false`` (as report/offload.py asks it again at offload=none): the plan it then picks,
recomputing or not, with its step time and memory, or, when nothing fits without offload, by how many GiB the
most frugal plan misses the usable memory.
"""

from __future__ import annotations

from autoplan.cost import usable_bytes
from autoplan.display import duration_text
from autoplan.report.search_again import search_again
from autoplan.types.graph import Graph
from autoplan.types.profile import Profile

GIB = 2**30


def activation_offload_why(result, *, graph: Graph, profile: Profile) -> str:
    """One sentence (module docstring); '' when the chosen plan does not offload its activations."""
    best, cost = result.best, result.best_cost
    searched = best.predicted.search if best is not None and best.predicted else None
    if best is None or not best.offload_activations or searched is None:
        return ""
    paid = cost.extra.get("activation_offload", {})
    sent = (
        f"offload_activations keeps {paid.get('host_bytes', 0.0) / GIB:.2f} GiB of saved activations per device on "
        f"the host and pays {duration_text(paid.get('copy_s', 0.0))} per step copying them out and back over the "
        f"host link in a step of {duration_text(cost.step_time_s)}"
    )
    return f"{sent}; {_next_option(best, searched, graph=graph, profile=profile, cost=cost)}."


def _next_option(best, searched, *, graph: Graph, profile: Profile, cost) -> str:
    """The next option, the search without activation offload: what it picks and costs, or why nothing fits."""
    from autoplan.solve.api import NoPlanFits

    try:
        flat = search_again(best, searched, graph=graph, profile=profile, pin={"offload_activations": False})
    except NoPlanFits as failed:
        priced = [c for c in (failed.result.candidates if failed.result else []) if c.cost is not None]
        if not priced:
            return "without it no plan fits in device memory"
        frugal = min(priced, key=lambda c: c.cost.peak_memory_bytes)
        usable = usable_bytes(profile.device.memory_bytes)
        return (
            f"without it no plan fits, recomputing or not: the most frugal ({frugal.plan.describe()}) needs "
            f"{frugal.cost.peak_memory_bytes / GIB:.2f} GiB per device, "
            f"{(frugal.cost.peak_memory_bytes - usable) / GIB:.2f} GiB more than the {usable / GIB:.2f} GiB usable"
        )
    rival = flat.best_cost
    how = f"recomputing ({flat.best.recompute})" if flat.best.recompute != "none" else "without recompute"
    gap_s = rival.step_time_s - cost.step_time_s  # a pin may offload where recomputing is faster
    return (
        f"the best plan without it, {how} ({flat.best.describe()}), steps in {duration_text(rival.step_time_s)}, "
        f"{duration_text(abs(gap_s))} {'more' if gap_s >= 0 else 'less'}, in {rival.peak_memory_bytes / GIB:.2f} "
        f"GiB against {cost.peak_memory_bytes / GIB:.2f} GiB"
    )
