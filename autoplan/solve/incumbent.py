"""An early incumbent: before its bounded loop the search prices plans best first across all its groups, so the
loop starts with the best plan's objective as its threshold (solve/search.py; docs/ilp.md, "An early incumbent").

Two priority queues, groups and members; the least key is taken until it is beaten (Search._beaten: it reaches
the k-th best objective priced so far). While nothing fits yet, members go first:

    group by bound (1)   -> keyed again by the least of its members' bound (2) with every stage at its floor
                            under any partition (member_bounds.options: no partition solved);
    group by that floor  -> Search._run_group with each price deferred (``probing``) queues the members its
                            bounds leave against the threshold of that moment, by bound (2);
    member               -> its bound (2) as the loop would now find it (a recompute budget counts only once
                            the plan without recompute did not fit, solve/recompute_budget.py): queued again
                            where that is higher, else priced by Search._evaluate, retries and all; rows held.

Each key is a floor of every key it is replaced by (while a member waits for its plan without recompute, it is keyed
by the stage times of no recompute, a floor of every budget), so a probe run to its end prices every plan the loop
would price against the final threshold before it is beaten. The loop prunes only by sound bounds against the
objectives of plans it priced, whichever order it meets them in, so its best plan, price and exact top k are those
of the plain loop (tests/unit/solve/test_incumbent.py). A probe's rows are put among the candidates, with the loop's
bound, where the loop reaches the same plan; the rows of a probe the loop prunes come last. What a group prices only
when nothing of it fits cannot fit, so it is not probed. The probe stops early after STALE_GROUPS expansions in a
row that left the k best where they were (the loop expands each probed group again to write its rows); the loop then
prices what the probe left, and stays exact.
"""

from __future__ import annotations

import heapq
import itertools
import math
from dataclasses import replace
from typing import Any

from autoplan.solve import member_bounds
from autoplan.solve.candidates import Candidate
from autoplan.types.plan import Plan

#: The probe stops after this many group expansions in a row that did not lower the threshold: the loop expands
#: each probed group again to write its rows, so a probe past its incumbent only adds work (GPT-1T on 3,072 A100s
#: expanded 252 groups for the 8 the loop needed). A budget on speed alone: the loop is exact whatever it starts at.
STALE_GROUPS = 16


class Probes:
    """The priced probes' rows, by plan, until the loop reaches each plan."""

    def __init__(self) -> None:
        self._rows: dict[str, list[tuple[Plan, list[Candidate]]]] = {}
        self.priced = 0  # plans priced by the probes (their retries included)
        self.floors: dict[int, float] = {}  # by id(group): a floor of bound (2) of each member (_least_member_bound)

    def take(self, plan: Plan, bound: float) -> list[Candidate] | None:
        """The rows of ``plan`` if it was probed (once), with the loop's ``bound``; else None."""
        held = self._rows.get(plan.describe()) if self._rows else None
        for i, (probed, rows) in enumerate(held or []):
            if probed == plan:
                del held[i]
                return [replace(row, lower_bound=bound) for row in rows]
        return None

    def leftovers(self) -> list[Candidate]:
        """The rows of the probes the loop never reached (it pruned them): priced plans all the same."""
        return [row for held in self._rows.values() for _, rows in held for row in rows]

    def hold(self, plan: Plan, rows: list[Candidate]) -> None:
        self._rows.setdefault(plan.describe(), []).append((plan, rows))
        self.priced += len(rows)


def probe(search: Any, groups: list[tuple[float, Any]]) -> Probes:
    """Price the plans of ``groups`` (bound (1), group) best first (module docstring) until the least key left is
    beaten; their rows held. While nothing fits yet, the queued members go before any group."""
    probes = Probes()
    if search.pricer is not None and search.pricer.spec.constrained:
        return probes  # the loop may skip a group by its run's deadline or budget: probe nothing
    order = itertools.count()  # ties: first queued, first taken
    queue = [(bound, next(order), False, group) for bound, group in groups]  # (key, tie, keyed by its members?, group)
    members: list = []  # (bound (2), tie, plan, ILP status, bound (2) as the budgets stand then)
    kept, budgets = search.candidates, search.budgets
    search.budgets = _AnyBudget(budgets)
    stale, last_top = 0, None  # groups expanded since the threshold last fell
    try:
        while queue or members:
            if members and (not search._top or not queue or members[0][:2] < queue[0][:2]):
                sub, _, plan, status, rebound = heapq.heappop(members)
                if search._beaten(sub):
                    break
                search.budgets = budgets  # bounded and priced as the loop would now
                if _own_times(budgets, plan) and (now := rebound()) > sub:  # no budget fitted to it (yet)
                    heapq.heappush(members, (now, next(order), plan, status, rebound))
                else:
                    _price(search, probes, plan, sub, status)
                search.budgets = _AnyBudget(budgets)
                continue
            key, _, keyed, group = heapq.heappop(queue)
            if search._beaten(key):
                break
            search.candidates = []  # the rows of what the threshold prunes here are the loop's to write
            if not keyed and (floor := _least_member_bound(search, group, key)) is not None:
                probes.floors[id(group)] = floor  # the loop prunes the group whole where the final threshold beats it
                heapq.heappush(queue, (floor, next(order), True, group))
            elif keyed:
                top = tuple(search._top)
                stale = 0 if top != last_top else stale + 1
                last_top = top
                if stale >= STALE_GROUPS:
                    break
                for sub, plan, status, rebound in _members(search, group, key):
                    heapq.heappush(members, (sub, next(order), plan, status, rebound))
    finally:
        search.candidates, search.budgets = kept, budgets
    return probes


def _own_times(budgets: Any, plan: Plan) -> bool:
    """Whether the loop would bound ``plan`` by its own stage times where the probe took those of no recompute
    (:class:`_AnyBudget`): it recomputes, and its plan without recompute has not been found short."""
    return budgets.searched and plan.recompute != "none" and budgets.timing(plan) is plan


def _price(search: Any, probes: Probes, plan: Plan, sub: float, status: str) -> None:
    """Price ``plan`` as the loop would, unless its memory floor sets it aside (Search._over_floor)."""
    search.candidates = []
    if not search._over_floor(plan, sub, [], []):
        search._evaluate(plan, sub, ilp_status=status)
        probes.hold(plan, search.candidates)


def _least_member_bound(search: Any, group: Any, bound: float) -> float | None:
    """A floor of bound (2) of each member of ``group``, its stages at their floors under any partition
    (member_bounds.options: no partition solved), or the present threshold where that is lower (the options
    it beats are not bounded); None where the loop prunes the group for its tp (Search._degenerate)."""
    choice = search._choose(group)
    if search._degenerate(group, choice):
        return None
    dp_choices = search._dp_choices(group.degrees)
    options = member_bounds.options(search, group, bound, choice, dp_choices, {})
    threshold = -search._top[0] if len(search._top) >= search.options.keep else math.inf
    return min(min((min(subs) for *_, subs in options if subs), default=math.inf), threshold)


def _members(search: Any, group: Any, bound: float) -> list[tuple]:
    """The plans ``group``'s loop would price against the present threshold: (bound (2), plan, ILP status, its
    bound (2) as the budgets stand when called)."""
    found: list = []
    search.probing = found
    try:
        search._run_group(group, bound)
    finally:
        search.probing = None
    return found


class _AnyBudget:
    """A member that recomputes is keyed by the stage times of no recompute, the floor of every budget
    (solve/recompute_budget.py): whether the loop fits it a budget depends on a plan without recompute that is
    not priced yet."""

    def __init__(self, budgets: Any) -> None:
        self._budgets = budgets

    def timing(self, plan: Plan, members: list[Plan] | None = None) -> Plan:
        if self._budgets.searched and plan.recompute != "none":
            return Plan.unchecked(**{**plan.__dict__, "recompute": "none"})
        return self._budgets.timing(plan, members)

    def fitted(self, model: Any, plan: Plan, feasible: bool) -> Plan | None:
        return self._budgets.fitted(model, plan, feasible)
