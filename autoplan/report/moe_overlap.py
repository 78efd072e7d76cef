"""Why a plan overlaps its EP all-to-all, in one sentence (``autoplan explain``; docs/cost-model.md, "EP
all-to-all overlap").

The plan is priced again without the overlap (``moe_a2a_overlap=false``, all else the same). The sentence sets
the all-to-all seconds the overlap hides per step (the difference of the two plans' ``Cost.ep_comm_s``) beside
what it leaves exposed (phases whose compute is too short to cover them, the SMs the communication takes from
the compute beside it, and the micro-batches the schedule runs alone: cost/moe/a2a_overlap.py), and the next
option's step time: the same plan with its all-to-all exposed.
"""

from __future__ import annotations

from dataclasses import replace

from autoplan.cost import CostModel
from autoplan.display import duration_text
from autoplan.types.cost import Cost
from autoplan.types.moe_overlap import overlap_refusal
from autoplan.types.plan import Plan


def a2a_overlap_why(model: CostModel, plan: Plan, cost: Cost) -> str:
    """The sentence (module docstring); '' for a plan that does not overlap its all-to-all."""
    if not plan.moe_a2a_overlap:
        return ""
    exposed = model.estimate(replace(plan, moe_a2a_overlap=False, predicted=None))
    hidden_s = exposed.ep_comm_s - cost.ep_comm_s
    return (
        f"moe_a2a_overlap runs each expert-parallel all-to-all beside another micro-batch's compute ({_runs_as(plan)}):"
        f" it hides {duration_text(hidden_s)} of the "
        f"{duration_text(exposed.ep_comm_s)} per step and leaves {duration_text(cost.ep_comm_s)} exposed (compute "
        "too short to cover a phase, the SMs the all-to-all takes from the compute beside it, and the micro-batches "
        f"run alone); with it exposed the step takes {duration_text(exposed.step_time_s)} against "
        f"{duration_text(cost.step_time_s)}."
    )


def _runs_as(plan: Plan) -> str:
    """Who pairs the micro-batches: DualPipeV's F&B actions (autoplan's executor runs them overlapped, another
    runtime does not: types/moe_overlap.py), else Megatron-Core's combined 1F1B."""
    if plan.schedule == "dualpipev":
        why = overlap_refusal(plan)
        return (
            f"DualPipeV's F&B pairs, priced only: {why}" if why else "DualPipeV's F&B pairs, run by autoplan's executor"
        )
    return "Megatron-Core's --overlap-moe-expert-parallel-comm"
