"""``autoplan explain``'s sentence on a plan's recompute budget (Plan.recompute_blocks): how many of each
stage's blocks recompute, why (each stage's peak with one block fewer, against the usable memory:
cost/memory/recompute_budget.py prices both), and what recomputing every block would cost instead.
docs/cost-model.md, "Budgeted recompute".
"""

from __future__ import annotations

from dataclasses import replace

from autoplan.cost import CostModel, stage_peaks_bytes, usable_bytes
from autoplan.display import duration_text
from autoplan.types.cost import Cost
from autoplan.types.layout import stage_of_chunk
from autoplan.types.plan import Plan

GIB = 2**30


def recompute_why(model: CostModel, plan: Plan, cost: Cost) -> str:
    """One sentence on why ``plan`` recomputes k of L blocks per stage (module docstring); '' when it
    recomputes nothing or every block."""
    if plan.recompute == "none" or not plan.recompute_blocks:
        return ""
    sizes = [len(chunk) for chunk in plan.stages] if plan.stages else None
    if sizes is None:
        return ""
    counts, usable = plan.recompute_blocks, usable_bytes(model.profile.device.memory_bytes)
    where = [_where(plan, c) for c in range(len(counts))]
    parts = [f"{k} of {size} blocks on {at}" for k, size, at in zip(counts, sizes, where)]
    shortfalls = []
    for c, k in enumerate(counts):
        if k == 0:
            continue
        fewer = [n - 1 if i == c else n for i, n in enumerate(counts)]
        peak = stage_peaks_bytes(model, plan, fewer)[stage_of_chunk(c, pp=plan.pp)]
        gap = (peak - usable) / GIB
        shortfalls.append(
            f"{gap:.2f} GiB more than the device has ({where[c]})" if gap > 0 else f"{-gap:.2f} GiB less ({where[c]})"
        )
    every_s = model.estimate(replace(plan, recompute_blocks=[], predicted=None)).step_time_s - cost.step_time_s
    fewer_text = f"; recomputing one block fewer needs {', '.join(shortfalls)}" if shortfalls else ""
    return (
        f"Recomputes ({plan.recompute}) {', '.join(parts)}, the fewest for each stage to fit in "
        f"{usable / GIB:.2f} GiB usable{fewer_text}; recomputing every block would take "
        f"{duration_text(every_s)} more per step."
    )


def _where(plan: Plan, chunk: int) -> str:
    """``stage 1``, or ``chunk 3 (stage 1)`` with interleaving."""
    stage = stage_of_chunk(chunk, pp=plan.pp)
    return f"stage {stage}" if plan.virtual_stages == 1 else f"chunk {chunk} (stage {stage})"
