"""``autoplan explain``'s sentence on a plan's recompute budget (Plan.recompute_blocks): how many of each
stage's blocks recompute, why (each stage's peak with one block fewer, against the usable memory:
cost/memory/recompute_budget.py prices both), and what recomputing every block would cost instead.
docs/cost-model.md, "Budgeted recompute".
"""

from __future__ import annotations

from dataclasses import replace

from autoplan.cost import CostModel, balanced_stages, stage_peaks_bytes, usable_bytes
from autoplan.display import duration_text
from autoplan.types.cost import Cost
from autoplan.types.plan import Plan
from autoplan.types.schedules import plan_stage_of_chunk

GIB = 2**30


def recompute_why(model: CostModel, plan: Plan, cost: Cost) -> str:
    """One sentence on why ``plan`` recomputes k of L blocks per stage (module docstring); '' when it
    recomputes nothing or every block."""
    if plan.recompute == "none" or not plan.recompute_blocks:
        return ""
    chunks = plan.stages or balanced_stages(model.graph.layers, plan.pp * plan.virtual_stages)
    sizes = [len(chunk) for chunk in chunks]
    counts, usable = plan.recompute_blocks, usable_bytes(model.profile.device.memory_bytes)
    where = [_where(plan, c) for c in range(len(counts))]
    parts = [f"{k} of {size} blocks on {at}" for k, size, at in zip(counts, sizes, where)]
    gaps = {at: _one_fewer_gap_bytes(model, plan, c, usable) for c, at in enumerate(where) if counts[c]}
    every_s = model.estimate(replace(plan, recompute_blocks=[], predicted=None)).step_time_s - cost.step_time_s
    every = f"recomputing every block would take {duration_text(every_s)} more per step"
    head = f"Recomputes ({plan.recompute}) {', '.join(parts)}"
    spare = {at: -gap for at, gap in gaps.items() if gap <= 0}
    if spare:  # a pinned budget: not the fewest that fit
        room = ", ".join(f"{gib / GIB:.2f} GiB spare on {at}" for at, gib in spare.items())
        return f"{head}, as pinned: recomputing one block fewer would still fit ({room}); {every}."
    over = ", ".join(f"{gap / GIB:.2f} GiB more than the device has ({at})" for at, gap in gaps.items())
    fewer = f"; recomputing one block fewer needs {over}" if over else ""
    return f"{head}, the fewest for each stage to fit in {usable / GIB:.2f} GiB usable{fewer}; {every}."


def _one_fewer_gap_bytes(model: CostModel, plan: Plan, chunk: int, usable: float) -> float:
    """How far over ``usable`` chunk's stage peaks when the chunk recomputes one block fewer."""
    fewer = [n - 1 if i == chunk else n for i, n in enumerate(plan.recompute_blocks)]
    return stage_peaks_bytes(model, plan, fewer)[plan_stage_of_chunk(plan, chunk)] - usable


def _where(plan: Plan, chunk: int) -> str:
    """``stage 1``, or ``chunk 3 (stage 1)`` with interleaving."""
    stage = plan_stage_of_chunk(plan, chunk)
    return f"stage {stage}" if plan.virtual_stages == 1 else f"chunk {chunk} (stage {stage})"
