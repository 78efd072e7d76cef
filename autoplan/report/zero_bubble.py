"""Why the chosen plan runs a zero-bubble schedule, in one sentence (``autoplan explain``; docs/cost-model.md,
"Zero-bubble schedules").

Against the next option, the same plan on the schedule that runs each backward whole (1F1B, or interleaved
1F1B over the same chunks when v > 1), priced by the same cost model: the bubble saved by deferring the
weight gradients (W) into it, and the memory paid on the fullest stage for holding every stage's p
micro-batches (and their output gradients) until their W. A V schedule (zbv, dualpipev) is set against
interleaved 1F1B over the same chunks, looping instead of in a V: the bubble its replay leaves and the memory
its peak holds (cost/pp/replay.py).
"""

from __future__ import annotations

from dataclasses import replace

from autoplan.cost import CostModel
from autoplan.display import duration_text
from autoplan.types.cost import Cost
from autoplan.types.plan import Plan
from autoplan.types.schedules import V_SCHEDULES, ZERO_BUBBLE

GIB = 2**30


def zero_bubble_why(model: CostModel, plan: Plan, cost: Cost) -> str:
    """One sentence (module docstring); '' when the plan runs no zero-bubble schedule or no pipeline."""
    if plan.schedule in V_SCHEDULES:
        return v_schedule_why(model, plan, cost)
    if plan.schedule not in ZERO_BUBBLE or plan.pp == 1:
        return ""
    whole = "interleaved_1f1b" if plan.virtual_stages > 1 else "1f1b"
    rival = model.estimate(replace(plan, schedule=whole, predicted=None))
    name = "ZB-H1" if plan.virtual_stages == 1 else f"interleaved zero-bubble over v={plan.virtual_stages} chunks"
    paid = (cost.peak_memory_bytes - rival.peak_memory_bytes) / GIB
    return (
        f"schedule {plan.schedule} ({name}) defers each micro-batch's weight gradients into the pipeline bubble: "
        f"{duration_text(cost.bubble_s)} of bubble against {duration_text(rival.bubble_s)} under {whole} "
        f"(step {duration_text(cost.step_time_s)} against {duration_text(rival.step_time_s)}), for "
        f"{paid:.2f} GiB more per device ({cost.peak_memory_bytes / GIB:.2f} against "
        f"{rival.peak_memory_bytes / GIB:.2f} GiB): every stage holds its micro-batches' activations until their "
        "weight gradients run."
    )


def v_schedule_why(model: CostModel, plan: Plan, cost: Cost) -> str:
    """One sentence for a V schedule (module docstring)."""
    rival = model.estimate(replace(plan, schedule="interleaved_1f1b", predicted=None))
    pairs = "with their EP all-to-alls overlapped" if plan.moe_a2a_overlap else "one after the other"
    name = {"zbv": "ZB-V", "dualpipev": f"DualPipeV, its F&B pairs run {pairs}"}[plan.schedule]
    paid = (cost.peak_memory_bytes - rival.peak_memory_bytes) / GIB
    return (
        f"schedule {plan.schedule} ({name}) runs two chunks per stage in a V with the weight gradients deferred: "
        f"{duration_text(cost.bubble_s)} of bubble against {duration_text(rival.bubble_s)} under interleaved_1f1b "
        f"over the same chunks (step {duration_text(cost.step_time_s)} against {duration_text(rival.step_time_s)}), "
        f"for {abs(paid):.2f} GiB {'more' if paid >= 0 else 'less'} per device "
        f"({cost.peak_memory_bytes / GIB:.2f} against {rival.peak_memory_bytes / GIB:.2f} GiB): each stage holds "
        "its chunks' activations until their weight gradients run, as the replay of torch's order peaks."
    )
