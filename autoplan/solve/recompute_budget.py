"""Budgeted recompute in the search: per pipeline chunk, how many blocks recompute (Plan.recompute_blocks).

Not a dimension of the outer search: for each priced plan that recomputes every block and fits, the
cost model finds the fewest leading blocks per chunk that still fit (``fit_recompute_blocks``,
cost/memory/recompute_budget.py: log2 L probes, since each stage's peak falls as it recomputes more
blocks), and that plan is priced beside it. It is faster whenever the budget is short of every block
(less of the forward re-run) and dominated by no recompute when nothing need recompute. The stage times
the search's bounds read for a recomputing plan are then those of no recompute, a floor of every budget
(solve/search.py). ``--fix recompute_blocks=2/1`` pins the budget instead: only plans with as many chunks
are searched, each chunk holding at least its count; ``--fix recompute=...`` alone searches every block,
as before budgets existed. docs/cost-model.md, "Budgeted recompute".
"""

from __future__ import annotations

from dataclasses import replace

from autoplan.cost import CostModel, balanced_stages, fit_recompute_blocks
from autoplan.types.plan import Plan


def fits_budgets(fixes: dict) -> bool:
    """Whether the search fits a budget to recomputing plans: neither recompute nor its budget pinned."""
    return "recompute" not in fixes and "recompute_blocks" not in fixes


def pinned_budget(fixes: dict, *, chunks: int) -> list[int] | None:
    """The pinned budget for a plan of ``chunks`` pipeline chunks; None when it does not apply to one
    (another chunk count), [] when nothing is pinned."""
    pinned = fixes.get("recompute_blocks")
    if pinned is None:
        return []
    return list(pinned) if len(pinned) == chunks else None


def with_pin(plan: Plan, fixes: dict) -> Plan | None:
    """``plan`` with the pinned budget; itself when none is pinned; None when its chunks cannot hold it."""
    budget = pinned_budget(fixes, chunks=plan.pp * plan.virtual_stages)
    if not budget or plan.recompute_blocks:
        return plan if budget is not None else None
    return replace(plan, recompute_blocks=budget) if holds(budget, plan.stages) else None


def holds(budget: list[int], stages: list[list[str]]) -> bool:
    """Whether each chunk runs at least as many blocks as the budget recomputes of it."""
    return not budget or not stages or all(k <= len(chunk) for k, chunk in zip(budget, stages))


def timing_plan(base: Plan, fixes: dict) -> Plan:
    """The plan whose stage times bound ``base``'s group members: with no recompute when the search
    fits a budget to it (every budget is at least that fast), else ``base``."""
    return replace(base, recompute="none") if base.recompute != "none" and fits_budgets(fixes) else base


def budgeted(model: CostModel, plan: Plan, fixes: dict) -> Plan | None:
    """``plan`` (recomputing every block, and fitting) with the fewest recomputed blocks that fit; None
    when that is every block, or none at all (the plan without recompute is searched and dominates),
    or when the user pinned recompute or its budget."""
    if plan.recompute == "none" or plan.recompute_blocks or not fits_budgets(fixes):
        return None
    counts = fit_recompute_blocks(model, plan)
    chunks = plan.stages or balanced_stages(model.graph.layers, plan.pp * plan.virtual_stages)
    if counts is None or not any(counts) or counts == [len(chunk) for chunk in chunks]:
        return None
    return replace(plan, recompute_blocks=counts)
