"""BudgetBounds.timing's plan of no recompute, made unchecked (Plan.unchecked) for the bounds, is the plan
``dataclasses.replace`` checks: equal field for field, on plans that vary the fields besides recompute (ZeRO, stages,
schedule, gradient sync), and the plan itself where its shape never fell short."""

from __future__ import annotations

from dataclasses import replace

from autoplan.solve.recompute_budget import BudgetBounds
from autoplan.types import Plan

STAGES = [["h.0", "h.1"], ["h.2", "h.3"]]


def _plan(**kw) -> Plan:
    fields = dict(devices=8, dp=4, tp=1, pp=2, micro_batch_size=1, num_microbatches=8, recompute="full")
    return Plan(**{**fields, **kw})


def test_the_timing_plan_is_the_checked_copy_without_recompute():
    budgets = BudgetBounds({}, "autoplan")
    budgets.fitted(None, _plan(recompute="none", zero_stage=1), feasible=False)  # this shape fell short
    for kw in (dict(zero_stage=1), dict(zero_stage=1, stages=STAGES), dict(zero_stage=1, recompute="selective")):
        plan = _plan(**kw)
        timing = budgets.timing(plan, lambda plan=plan: [plan, replace(plan, zero_stage=2)])
        assert timing is not plan and timing == replace(plan, recompute="none")
        assert plan.recompute == kw.get("recompute", "full")  # the plan asked is left as it was
    other = _plan(schedule="gpipe", zero_stage=1)  # another shape: never short
    assert budgets.timing(other) is other
