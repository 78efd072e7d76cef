"""Why the chosen plan compresses its gradients, in one sentence (``autoplan explain``; docs/cost-model.md,
"Lossy gradient sync" and "Top-k sparsification").

Against the next option, the same search pinned to ``grad_compression=none`` (as report/offload.py asks the
planner again without offload): the compressed plan's exposed gradient sync and its compression compute
(``Cost.dp_comm_exposed_s``, ``Cost.compression_s``) against the best uncompressed plan's sync, and the
step times, so the sentence says by how much compression pays (or, where a pin forced it, what it costs).
"""

from __future__ import annotations

from dataclasses import replace

from autoplan.display import duration_text, trade_text
from autoplan.report.search_again import without_fits
from autoplan.types.graph import Graph
from autoplan.types.profile import Profile


def compression_why(result, *, graph: Graph, profile: Profile) -> str:
    """One sentence (module docstring); '' when the chosen plan does not compress its gradients."""
    best, cost = result.best, result.best_cost
    searched = best.predicted.search if best is not None and best.predicted else None
    if best is None or best.grad_compression == "none" or searched is None:
        return ""
    head = (
        f"{_what(best)} leaves {duration_text(cost.dp_comm_exposed_s)} of exposed gradient sync and adds "
        f"{duration_text(cost.compression_s)} of its own compute per step"
    )
    unpinned = replace(searched, fixes={k: v for k, v in searched.fixes.items() if k not in ("topk_ratio", "powersgd")})
    pin = {"grad_compression": "none"}
    flat, said = without_fits(best, unpinned, graph=graph, profile=profile, pin=pin, what="without it", digits=1)
    if flat is None:
        return f"{head}; {said}."
    rival = flat.best_cost
    gap_s = rival.step_time_s - cost.step_time_s
    trade = trade_text(gap_s, verb="pays")
    return (
        f"{head}; the best plan without gradient compression ({flat.best.describe()}) exposes "
        f"{duration_text(rival.dp_comm_exposed_s)} of gradient sync and steps in {duration_text(rival.step_time_s)} "
        f"against {duration_text(cost.step_time_s)}, so compression {trade} per step "
        f"({rival.step_time_s / cost.step_time_s:.2f}x)."
    )


def _what(plan) -> str:
    if plan.grad_compression == "topk":
        return f"top-k sparsification at {plan.topk_ratio:.3g} of each bucket, all-gathered as (index, value) pairs,"
    return f"PowerSGD at rank {plan.powersgd_rank}"
