"""A plan's memory alone: what ``CostModel.estimate`` charges a device and whether it fits, without its time.

The search asks this first (solve/memory_first.py): the peak, its parts and the feasibility read only the
per-stage totals (cost/stages.py) and the memory terms (cost/memory/plan.py), never a time term, so a plan
that cannot fit is known before its step time is priced, about a quarter of ``estimate``'s work on GPT-1T
(docs/ilp.md, "Memory before time"). ``estimate`` fills its memory with :func:`fill_memory`, the one
statement of this part, so the two cannot disagree (tests/unit/cost/test_memory_alone.py).
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING

from autoplan.cost.cp.weights import weight_sync_plan
from autoplan.cost.stages import StageTotals
from autoplan.types.cost import Cost
from autoplan.types.hsdp import shard_view
from autoplan.types.plan import Plan
from autoplan.types.schedule_steps import schedule_step_plan

if TYPE_CHECKING:
    from autoplan.cost.model import CostModel


#: the Cost fields PlanMemory.fill sets; with them, the ``extra`` entries it writes and, where the plan does not fit,
#: ``feasible`` and ``reason``: all it writes (it reads none it did not write)
MEMORY_FIELDS = (
    "weights_bytes",
    "grads_bytes",
    "optimizer_bytes",
    "activations_bytes",
    "comm_buffer_bytes",
    "peak_memory_bytes",
    "memory_capacity_bytes",
)


def fill_memory(model: CostModel, cost: Cost, plan: Plan, stages: list[StageTotals]) -> None:
    """Write ``plan``'s memory parts, peak and feasibility into ``cost`` (PlanMemory.fill), its weights shared
    by the dp x cp ranks (cost/cp/weights.py): one schedule step's (types/schedule_steps.py), the activation
    offload's copies counted over all k of them. The last plan's is kept (``model.memory.last_fill``): the search
    prices a plan's memory alone, then, where it fits, the whole plan (solve/memory_first.py), on the same memoised
    ``stages``; a plan equal to the last, on the very same stages, has its memory copied, not priced again."""
    last = model.memory.last_fill
    if last is None or last[1] is not stages or last[0] != plan:
        filled = Cost()
        weights = weight_sync_plan(schedule_step_plan(plan))
        powersgd = [model.powersgd_stage(weights, s) for s in stages]
        model.memory.fill(filled, shard_view(weights), stages, powersgd, schedule_steps=plan.schedule_steps)
        last = model.memory.last_fill = (copy.copy(plan), stages, filled)  # a plan edited later: not equal
    _copy_memory(last[2], cost)


def _copy_memory(filled: Cost, cost: Cost) -> None:
    """What PlanMemory.fill wrote into the fresh Cost ``filled`` (:data:`MEMORY_FIELDS`), written into ``cost``."""
    for name in MEMORY_FIELDS:
        setattr(cost, name, getattr(filled, name))
    cost.extra.update(copy.deepcopy(filled.extra))  # its own: a reader's edit reaches no later copy
    if not filled.feasible:
        cost.feasible, cost.reason = False, filled.reason


def memory_alone(model: CostModel, plan: Plan) -> Cost:
    """``plan``'s Cost with only its memory fields, feasibility and reason set, as ``model.estimate`` sets them;
    every time field is left at 0."""
    model = model.for_runtime(plan.runtime)
    stages, _tp_plan, _ctx = model.priced_stages(plan, copy=False)  # read only: fill_memory memoises on them
    cost = Cost()
    fill_memory(model, cost, plan, stages)
    return cost
