"""Why a plan lays its MoE experts out as it does, in one sentence (docs/moe.md, "Expert tensor parallelism").

The plan is priced again with the same degrees and everything else but the experts' default layout
(``ep = 1``, ``expert_tp = 1``: every rank holds every expert, at tp > 1 each tp rank's tokens run the
whole block). The sentence sets the layout's share of the routed experts per rank, its exposed
all-to-all and etp collectives (``Cost.ep_comm_s``), and the two plans' step times and peaks per device
side by side.
"""

from __future__ import annotations

from dataclasses import replace

from autoplan.cost import CostModel
from autoplan.display import duration_text
from autoplan.errors import PlanError
from autoplan.types.cost import Cost
from autoplan.types.expert_layout import expert_dp, experts_apart
from autoplan.types.plan import Plan

GIB = 2**30


def expert_layout_why(model: CostModel, plan: Plan, cost: Cost) -> str:
    """The sentence (module docstring); '' for a plan whose experts keep the default layout."""
    if not experts_apart(plan):
        return ""
    layout = f"expert_tp={plan.expert_tp} x ep={plan.ep} x edp={expert_dp(plan)}"
    head = (
        f"{layout} gives each rank 1/{plan.ep * plan.expert_tp} of the routed experts, whose all-to-all"
        f"{' and etp collectives' if plan.expert_tp > 1 else ''} take {duration_text(cost.ep_comm_s)} per step"
    )
    try:
        whole = model.estimate(replace(plan, ep=1, expert_tp=1, predicted=None))
    except PlanError as refused:
        return f"{head}; every expert on every rank cannot be priced here ({refused})."
    fits = "" if whole.feasible else ", which does not fit"
    return (
        f"{head}; with every expert on every rank (ep=1, expert_tp=1) the step takes "
        f"{duration_text(whole.step_time_s)} against {duration_text(cost.step_time_s)}, at "
        f"{whole.peak_memory_bytes / GIB:.1f} GiB per device{fits} against {cost.peak_memory_bytes / GIB:.1f} GiB."
    )
