"""Memory before time: the search prices a plan's memory alone first (autoplan.cost.memory_alone) and its step
time only where it fits (docs/ilp.md, "Memory before time").

A plan that does not fit can never be the best, so its time is not needed to rank the feasible plans: the
best plan and its price are those of a search that prices every time (tests/unit/solve/test_memory_first.py).
The retries read only memory: a pipelined plan that does not fit is repartitioned within the memory limits
(Partitions.within_memory) and priced in full where that fits; the activation-offload retry reads the peak and
its activations (solve/activation_offload.py), the recompute budgets the feasibility (solve/recompute_budget.py).
A plan left over its memory keeps its row, which says what it needs (:func:`memory_row`), with the Cost of its
memory alone, which the group's memory-budgeted TP retry reads (solve/search.py), and no objective. Measured on
GPT-1T on 3,072 A100s, 93% of the plans the search reaches do not fit, and their time is ~3/4 of a price.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from autoplan.cost import memory_alone
from autoplan.solve import recompute_budget
from autoplan.solve.candidates import Candidate, config_of
from autoplan.types.cost import Cost
from autoplan.types.plan import Plan
from autoplan.types.schedule_steps import schedule_step_plan


def price(search: Any, plan: Plan) -> tuple[Cost, Plan, bool]:
    """``plan`` (or its repartition within memory, where only that fits) with its full Cost where it fits, else
    with the Cost of its memory alone, and whether its time was priced; with ``search.memory_first`` off, every
    plan's full Cost, as before this rule."""
    model = search.cost_model
    if not search.memory_first:
        cost = model.estimate(plan)
        return (*_repartitioned(search, plan, cost, model.estimate), True) if not cost.feasible else (cost, plan, True)
    cost = memory_alone(model, plan)
    if not cost.feasible:
        cost, plan = _repartitioned(search, plan, cost, lambda p: memory_alone(model, p))
    return (model.estimate(plan), plan, True) if cost.feasible else (cost, plan, False)


def _repartitioned(search: Any, plan: Plan, cost: Cost, pricer) -> tuple[Cost, Plan]:
    """The time-optimal stages (or chunks) did not fit: the best partition under the memory limits, priced by
    ``pricer``, where it fits; else ``plan`` and its ``cost``."""
    if plan.pp == 1 or _no_partition_fits(search, plan):
        return cost, plan
    stages = search.partitions.within_memory(plan)
    if stages is None or not recompute_budget.holds(plan.recompute_blocks, stages):
        return cost, plan
    retry = replace(plan, stages=stages)
    retry_cost = pricer(retry)
    return (retry_cost, retry) if retry_cost.feasible else (cost, plan)


def _no_partition_fits(search: Any, plan: Plan) -> bool:
    """Whether a floor of ``plan``'s peak under every partition exceeds the device: its states, the activations in
    flight (none counted where they are on the host) and the sends torch's runtime holds (Bounds.memory_floor_bytes,
    Bounds.sends; none depends on the partition). Then no repartition fits, and its search is skipped: the
    retry would have returned ``plan`` and its cost all the same. The floors are read cheapest first, the states
    alone (which Bounds.memory_floor_bytes takes the larger of) before the schedule's replay: a plan over the device
    by its states alone (a group's most frugal, priced for its TP retry) needs no replay of its schedule."""
    bounds, offload, usable = search.bounds, plan.offload_activations, search._usable_bytes
    if bounds.states_floor_bytes(schedule_step_plan(plan)) > usable or bounds.sends.floor_bytes(plan) > usable:
        return True
    return bounds.memory_floor_bytes(plan, offload=offload) > usable


def row(search: Any, plan: Plan, bound: float, cost: Cost, *, timed: bool, ilp_status: str) -> Candidate:
    """The row of a plan :func:`price` priced: evaluated where its time was, else :func:`memory_row`."""
    if not timed:
        return memory_row(plan, bound, cost)
    reason = cost.reason if not cost.feasible else f"tp ILP {ilp_status}"
    value = search.objective(cost.step_time_s, plan.devices)
    return Candidate(
        config_of(plan), "evaluated", lower_bound=bound, objective=value, cost=cost, plan=plan, reason=reason
    )


def memory_row(plan: Plan, bound: float, cost: Cost) -> Candidate:
    """The row of a plan whose priced memory does not fit: evaluated, saying what it needs, with no objective (its
    time not priced; plans.csv leaves those cells blank)."""
    return Candidate(config_of(plan), "evaluated", lower_bound=bound, cost=cost, plan=plan, reason=cost.reason)
