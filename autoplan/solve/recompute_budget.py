"""Budgeted recompute in the search: per pipeline chunk, how many blocks recompute (Plan.recompute_blocks).

Not a dimension of the outer search: for each priced plan that recomputes every block and fits, the
cost model finds the fewest leading blocks per chunk that still fit (``fit_recompute_blocks``,
cost/memory/recompute_budget.py: log2 L probes, since each stage's peak falls as it recomputes more
blocks), and that plan is priced beside it: faster whenever the budget is short of every block.
Only where the same member without recompute was priced and did not fit (:class:`BudgetBounds` says
why no other budget could enter the top k); such a member is bounded by the stage times of no
recompute, a floor of every budget, so the top k stays exact; the others by their own.
``--fix recompute_blocks=2/1`` pins the budget instead: only plans with as many chunks are searched,
each chunk holding at least its count; ``--fix recompute=...`` alone searches every block, as before
budgets existed. docs/cost-model.md, "Budgeted recompute".
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable

from autoplan.cost import CostModel, balanced_stages, fit_recompute_blocks
from autoplan.solve.candidates import config_of
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


class BudgetBounds:
    """Which priced plans the search fits a budget to, and the stage times that bound them (module
    docstring). Only a member whose plan without recompute was priced and did not fit can gain from a
    budget: where that plan fits, a budget recomputes nothing; where it was pruned by its bound, every
    budget (no faster than it) is too; where its states alone did not fit, no budget fits. Such a
    member is bounded by the stage times of no recompute, a floor of every budget; the others by
    their own. ``_stage_options`` lists a group's "none" members before its recomputing ones."""

    def __init__(self, fixes: dict, runtime: str):
        self.searched = fits_budgets(fixes) and runtime in PER_CHUNK + ONE_COUNT
        self._short: set[tuple] = set()  # members whose plan without recompute was priced and did not fit
        self._short_shapes: set[tuple] = set()  # their _shape: a plan of another shape is no such member

    def timing(self, plan: Plan, members: Callable[[], list[Plan]] | None = None, *, states_fit=None) -> Plan:
        """The plan whose stage times bound ``plan`` (and its ZeRO and sync variants, which ``members`` makes: they
        share its _shape, so they are made only where that shape fell short). ``states_fit`` is not read: only a
        priced plan that fit is fitted a budget (:meth:`fitted`); best_first's bounds pass it. The plan of no
        recompute is made unchecked (Plan.unchecked), as the search's candidates are: only a bound reads it."""
        if plan.recompute == "none" or _shape(plan) not in self._short_shapes:  # implied by each _member
            return plan
        budgeted = any(_member(p) in self._short for p in (members() if members else [plan]))
        return Plan.unchecked(**{**plan.__dict__, "recompute": "none"}) if budgeted else plan

    def fitted(self, model: CostModel, plan: Plan, feasible: bool) -> Plan | None:
        """Record a priced plan; the plan with its fitted budget to price next, if any (:func:`budgeted`)."""
        if plan.recompute == "none" and not feasible and self.searched:
            self._short.add(_member(plan))
            self._short_shapes.add(_shape(plan))
        if not (feasible and _member(plan) in self._short):
            return None
        return budgeted(model, plan)


def _member(plan: Plan) -> tuple:
    """A plan's place in the search but for its recompute and its partition."""
    config = config_of(plan)
    return tuple(value for key, value in config.items() if key != "recompute")


def _shape(plan: Plan) -> tuple:
    """The part of a plan's _member that its ZeRO and gradient-sync variants share (config_of's fields)."""
    return (plan.devices, plan.dp, plan.tp, plan.pp, plan.ep, plan.expert_tp, plan.cp, plan.cp_variant) + (
        plan.micro_batch_size,
        plan.num_microbatches,
        plan.schedule,
        plan.virtual_stages,
        plan.sequence_parallel,
        plan.tp_comm_overlap,
        plan.precision,
    )


#: what each runtime runs of a budget (docs/export.md, "Budgeted recompute"): autoplan's executor a
#: count per chunk; Megatron-LM one count for every chunk (--recompute-num-layers); torchtitan and
#: DeepSpeed checkpoint every block they are given, so no budget is searched for them
PER_CHUNK, ONE_COUNT = ("autoplan",), ("megatron", "megatron-lm-2022")


def budgeted(model: CostModel, plan: Plan) -> Plan | None:
    """``plan`` (recomputing every block, and priced to fit on its stages) with the fewest recomputed blocks
    that fit and its runtime runs; None when that is every block, or none at all (the plan without recompute
    is searched and dominates), or when the runtime runs no budget."""
    if plan.recompute == "none" or plan.recompute_blocks or plan.runtime not in PER_CHUNK + ONE_COUNT:
        return None
    counts = fit_recompute_blocks(model, plan, fits=True)  # only a plan priced to fit is fitted a budget
    sizes = [len(chunk) for chunk in plan.stages or balanced_stages(model.graph.layers, plan.pp * plan.virtual_stages)]
    if counts is not None and plan.runtime in ONE_COUNT:  # the largest stage's count on every chunk
        counts = [min(max(counts), size) for size in sizes]
    if counts is None or not any(counts) or counts == sizes:
        return None
    return replace(plan, recompute_blocks=counts)
