"""Why the chosen plan offloads its activations, in one sentence (``autoplan explain``; docs/cost-model.md,
"Activation offload").

What the plan sends to the host (``Cost.extra["activation_offload"]``: the host bytes per device, the copies'
seconds per step, cost/memory/activation_offload.py), against the next option, the same search pinned to
``offload_activations=false`` (as report/offload.py asks it again at offload=none): the plan it then picks,
recomputing or not, with its step time and memory, or, when nothing fits without offload, by how many GiB the
most frugal plan misses the usable memory.
"""

from __future__ import annotations

from autoplan.display import duration_text
from autoplan.report.search_again import without_fits
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
    pin, what = {"offload_activations": False}, "without it"
    flat, said = without_fits(best, searched, graph=graph, profile=profile, pin=pin, what=what, digits=2)
    if flat is None:
        return said.replace("no plan fits:", "no plan fits, recomputing or not:")
    rival = flat.best_cost
    how = f"recomputing ({flat.best.recompute})" if flat.best.recompute != "none" else "without recompute"
    gap_s = rival.step_time_s - cost.step_time_s  # a pin may offload where recomputing is faster
    return (
        f"the best plan without it, {how} ({flat.best.describe()}), steps in {duration_text(rival.step_time_s)}, "
        f"{duration_text(abs(gap_s))} {'more' if gap_s >= 0 else 'less'}, in {rival.peak_memory_bytes / GIB:.2f} "
        f"GiB against {cost.peak_memory_bytes / GIB:.2f} GiB"
    )
