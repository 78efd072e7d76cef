"""The search's one best-first pass over its groups and their members (solve/search.py; docs/ilp.md, "One best-first
pass"): each group expanded once, each member priced at most once, every row written once.

Two priority queues, groups and members; the least key is taken until it is beaten (Search._beaten: it reaches
the k-th best objective priced so far). While nothing fits yet, members go first:

    group by bound (1)   -> its row where its run misses the deadline or budget at that bound, or its tp splits no
                            op (Search._degenerate); else its stage options bounded with every stage at its floor
                            under any partition (member_bounds.options: no partition solved), the group keyed again
                            by the least of their bounds (2);
    group by that floor  -> expanded (:meth:`Pass._expand`): a member whose states alone exceed the device set aside
                            (:meth:`Pass._states_over`), each other partitioned and bounded by (2), its row written
                            where the threshold of the moment beats it, else queued;
    member               -> bound (2) as the budgets now stand (a recompute budget counts only once the plan without
                            recompute did not fit, solve/recompute_budget.py): queued again where that is higher;
                            else set aside by its memory floor (Search._over_floor) or priced (Search._evaluate).

Keys are lower bounds of every plan they stand for (a recomputing member is keyed by the stage times of no recompute,
the floor of every budget, until its plan without recompute has been found to fit or not), so once the least is
beaten so is everything left: each group left gets one row, each member its own (:meth:`Pass._flush`). When every
member of a group's tp_plan is resolved, its tail runs (:meth:`Pass._settle`): at tp > 1 where nothing priced fits,
the plans its floors held back are priced in floor order until the least peak is known, the memory-budgeted retry of
the tp ILP starts from it and is keyed and expanded in turn. The pass prunes only by sound bounds against plans it
priced, so the best plan, its price and the exact top k are an exhaustive run's (tests/unit/solve/test_best_first.py).
With ``best_first`` off, groups go in bound (1) order, each priced as it is expanded (the plain branch and bound)."""

from __future__ import annotations

import contextlib
import heapq
import itertools
import math
from dataclasses import dataclass, field
from typing import Any, Callable

from autoplan.cost import memory_budget
from autoplan.solve import candidates, member_bounds, schedule_steps, stage_floor, tp_choices
from autoplan.solve.candidates import Candidate, Group
from autoplan.types.plan import Plan


@dataclass(eq=False)
class _Choice:
    """One tp_plan of a group (its ILP's, or the memory-budgeted retry's) as the pass works through it."""

    group: Group
    bound: float  # the group's bound (1)
    choice: Any  # solve/tp_plan.py TPChoice
    first: bool  # the group's first tp_plan (else the memory-budgeted retry)
    dp_choices: list = field(default_factory=list)  # the (zero, grads) it serves (solve/tp_choices.py)
    counted: bool = True  # the group's progress step is this tp_plan's (one of a group's first tp_plans)
    options: list = field(default_factory=list)  # until expanded: (fields, own bound, sends, ZeRO bounds) of each
    # of member_bounds.options, its plans made again where needed (held, 449 groups' plans took 1.3M objects)
    pruned: list = field(default_factory=list)  # (bound, fields) of the options their schedule bound rules out
    extras: dict = field(default_factory=dict)  # member_bounds' step_extras_s memo
    waiting: int = 0  # members queued and not yet priced, set aside or pruned
    priced: list[Candidate] = field(default_factory=list)  # rows with a Cost
    too_big: list = field(default_factory=list)  # (floor, plan, bound, why): states over the device (_over_floor)
    held: list = field(default_factory=list)  # (floor, plan, bound, why): with their activations in flight or sends


#: a floor and a peak sum the same terms in other orders: a floor within this share above a peak is priced still
FLOOR_ROUNDING = 1e-9


class Pass:
    """One pass over ``groups`` ((bound (1), group), best first) of ``search`` (a solve/search.py Search)."""

    def __init__(self, search: Any, groups: list[tuple[float, Group]], *, best_first: bool = True, shares=None):
        self.search, self.best_first, self.total, self.shares = search, best_first, len(groups), shares
        self._tie = itertools.count()  # ties: first queued, first taken
        self._groups = [(bound, next(self._tie), bound, group, None) for bound, group in groups]  # (key, tie,
        # bound (1), group, its _Choice once bounded); members: (key, tie, keyed by its own times?, plan, its bound (2)
        # as the budgets stand when called, _Choice)
        self._members: list = []
        self.done = 0  # groups resolved, for the progress bar

    def run(self) -> None:
        s = self.search
        while self._groups or self._members:
            if self.shares is not None and self.shares.split(self):  # one share of them on (solve/shares.py)
                self.shares = None
            if self._members and (not s._top or not self._groups or self._members[0][:2] < self._groups[0][:2]):
                self._next_member()
            else:
                self._next_group()

    # ---- the queues ----------------------------------------------------------------------
    def _next_group(self) -> None:
        key, _, bound, group, state = heapq.heappop(self._groups)
        if self.search._beaten(key):
            heapq.heappush(self._groups, (key, next(self._tie), bound, group, state))
            return self._flush()
        if state is None:
            return self._open(group, bound)
        self._expand(state)

    def _next_member(self) -> None:
        key, _, own_keyed, plan, rebound, state = entry = heapq.heappop(self._members)
        if own_keyed and not member_bounds.own_times(self.search, plan, rebound):  # its plan without recompute: short
            return self._push_member(rebound(), False, plan, rebound, state)
        if self.search._beaten(key):
            heapq.heappush(self._members, entry)
            return self._flush()
        self._consider(key, own_keyed, plan, rebound, state)

    def _push_member(self, key: float, own_keyed: bool, plan: Plan, rebound, state: _Choice) -> None:
        heapq.heappush(self._members, (key, next(self._tie), own_keyed, plan, rebound, state))

    def _flush(self) -> None:
        """The least key is beaten: a row for each group left (a retry's tp_plan: one per option or plan), and for
        each member left whose key, brought up to date, is beaten too (the others are queued again)."""
        s = self.search
        while self._groups:
            key, _, bound, group, state = heapq.heappop(self._groups)
            if state is None:
                s._prune_group(group, key, "group bound")
                self._progress()
            elif state.first:
                s._prune_group(group, key, "members' bound", count=len(s._stage_options(group)) * len(state.dp_choices))
                if state.counted:
                    self._progress()
            else:
                self._expand(state)  # every bound is beaten: rows only, no partition solved
        members, self._members = self._members, []
        while members:
            key, tie, own_keyed, plan, rebound, state = heapq.heappop(members)
            if own_keyed and not member_bounds.own_times(s, plan, rebound):
                key, own_keyed = rebound(), False
            if not s._beaten(key):
                self._push_member(key, own_keyed, plan, rebound, state)
                continue
            self._pruned(plan, key, state)
            self._done(state)

    def _progress(self) -> None:
        self.done += 1
        if self.search.options.progress:
            self.search.options.progress(self.done, self.total)

    # ---- a group and its tp_plans ------------------------------------------------------------
    def _open(self, group: Group, bound: float) -> None:
        """A group taken at bound (1): pruned for its run or its tp, else its first tp_plan bounded."""
        s, deg = self.search, group.degrees
        if s.pricer is not None and s.pricer.spec.constrained:  # the run misses even at bound (1)
            if misses := s.pricer.violation(step_time_s=s.step_lower_bound_s(group), devices=deg.devices):
                s._prune_group(group, bound, "run", reason=f"pruned: even at its lower bound the run {misses}")
                return self._progress()
        if not (kept := tp_choices.kept(s, group, bound)):
            return self._progress()
        for i, (choice, dp) in enumerate(kept):
            self._bound_choice(_Choice(group, bound, choice, first=True, dp_choices=dp, counted=i == 0))

    def _bound_choice(self, state: _Choice) -> None:
        """Bound ``state``'s options without partitions; key it by the least (best first), or expand it now."""
        s, g = self.search, state.group
        with self._floors():
            dp_choices = state.dp_choices
            opts = member_bounds.options(s, g, state.bound, state.choice, dp_choices, state.extras, state.pruned)
            state.options = [(_fields(base), own, sends, subs) for base, own, sends, subs in opts]
        if not self.best_first:
            return self._expand(state)
        threshold = -s._top[0] if len(s._top) >= s.options.keep else math.inf  # the options it beat: unbounded
        floor = min(min((min(subs) for *_, subs in state.options if subs), default=math.inf), threshold)
        heapq.heappush(self._groups, (floor, next(self._tie), state.bound, g, state))

    def _expand(self, state: _Choice) -> None:
        """Partition and bound (2) every member of ``state`` that the threshold of the moment leaves; write the rows
        of the others; queue those (best first) or price them now."""
        s, g = self.search, state.group
        names = dict(model=s.graph.model_name, profile=s.profile.name, tp_plan=state.choice.tp_plan)
        dp_choices, members = state.dp_choices, []
        for own, known in state.pruned:
            s._prune_group(g, own, "schedule bound", count=len(dp_choices), **known)
        with self._floors():
            for kw, own, sends, subs in state.options:
                if all(s._beaten(sub) for sub in subs):  # every ZeRO choice, without solving the partition
                    for (zero, grads), sub in zip(dp_choices, subs):
                        s._append_pruned(g.plan(zero=zero, grads=grads, **kw, **names), sub)
                    continue
                stages = s._stages(g.plan(zero=0, **kw, **names))
                for i, (zero, grads) in enumerate(dp_choices):
                    plan = g.plan(zero=zero, stages=stages, grads=grads, **kw, **names)
                    if self._states_over(state, plan, at := (stages, own, sends, i), subs[i]):
                        continue
                    sub = member_bounds.member_bound(s, g, plan, at, state.extras)
                    if s._beaten(sub):
                        s._append_pruned(plan, sub)
                        continue
                    members.append((sub, plan, _Rebound(s, g, plan, at, state.extras)))
        state.options, state.pruned, state.waiting = [], [], len(members)
        if state.first and state.counted:
            self._progress()
        if not members:
            return self._settle(state)
        for sub, plan, rebound in members:
            if self.best_first:
                self._push_member(sub, False, plan, rebound, state)
            elif s._beaten(sub):
                s._append_pruned(plan, sub)
                self._done(state)
            else:
                self._consider(sub, False, plan, rebound, state)

    def _states_over(self, state: _Choice, plan: Plan, at: tuple, sub: float) -> bool:
        """Whether ``plan``'s states alone exceed the device (member_bounds.states_floor_bytes): no partition or
        recompute budget makes it fit, so it is neither bounded by (2) nor queued. Its option's bound whatever the
        stages, ``sub``, keys it: its row is pruned where that is beaten, else it is set aside (``too_big``)."""
        s = self.search
        if (floor := member_bounds.states_floor_bytes(s, plan, at, state.extras)) <= s._usable_bytes:
            return False
        if s._beaten(sub):
            s._append_pruned(plan, sub)
        else:
            state.too_big.append((floor, plan, sub, ""))
        return True

    # ---- a member --------------------------------------------------------------------------
    def _consider(self, key: float, own_keyed: bool, plan: Plan, rebound, state: _Choice) -> None:
        """A member whose key is not beaten: keyed again by its own stage times where those bound it now, else set
        aside by its memory floor or priced."""
        s = self.search
        if not own_keyed and member_bounds.own_times(s, plan, rebound) and (now := rebound()) > key:
            if self.best_first:
                return self._push_member(now, True, plan, rebound, state)
            if s._beaten(key := now):
                self._pruned(plan, key, state)
                return self._done(state)
        states = rebound.states_floor_bytes()  # read by each floor below: no k changes it
        if not schedule_steps.enters(plan, state.group.schedule_steps):  # a larger k (solve/schedule_steps.py)
            if schedule_steps.floors_fit(s, plan, states_bytes=states):
                self._price(state, plan, key, rebound=rebound)
            else:  # its floors rule out the smaller k too: the least larger k whose floors fit, if any
                self._push_steps(schedule_steps.next_fitting(s, plan, states_bytes=states), rebound, state)
        elif not s._over_floor(plan, key, state.too_big, state.held, states_bytes=states):
            self._price(state, plan, key, rebound=rebound)
        elif s.steps_searched:  # held at its entry k: the least larger k whose floors fit, if any
            self._push_steps(schedule_steps.next_fitting(s, plan, states_bytes=states), rebound, state)
        self._done(state)

    def _price(self, state: _Choice, plan: Plan, bound: float, *, rebound=None) -> None:
        """Price ``plan`` (Search._evaluate); its rows at their entry schedule steps join ``state.priced`` (the
        TP retry reads those, as before schedule steps were searched). With ``rebound`` (a member's bound), the plans
        it leaves their next schedule steps to search join the members (:meth:`_push_steps`)."""
        s, first = self.search, len(self.search.candidates)
        s.steps_next = []
        s._evaluate(plan, bound, ilp_status=state.choice.status, chain=rebound is not None)
        k = state.group.schedule_steps
        state.priced.extend(c for c in s.candidates[first:] if c.cost is not None and schedule_steps.enters(c.plan, k))
        for left in s.steps_next if rebound is not None else ():
            self._push_steps(schedule_steps.next_fitting(s, left), rebound, state)

    def _push_steps(self, stepped: Plan | None, rebound, state: _Choice) -> None:
        """Queue ``stepped`` (a member at a larger schedule step: solve/schedule_steps.py) keyed by its own bound (2),
        the least of its k's and every larger k's (member_bounds.member_bound, with ``rebound``'s group, stages and
        memos) as the floors' budgets give it: where that is beaten, so is every larger k of it, and no row is
        written."""
        if stepped is None:
            return
        _, group, _, at, extras = rebound.args
        rebound = _Rebound(self.search, group, stepped, at, extras)
        with self._floors():
            key = rebound()
        state.waiting += 1
        self._push_member(key, False, stepped, rebound, state)

    def _pruned(self, plan: Plan, key: float, state: _Choice) -> None:
        """The row of a member its bound prunes; none for a larger schedule step's (solve/schedule_steps.py): its
        layout has its row at its entry k, and plans.csv keeps the rows it had where no plan needs one."""
        if schedule_steps.enters(plan, state.group.schedule_steps):
            self.search._append_pruned(plan, key)

    def _done(self, state: _Choice) -> None:
        state.waiting -= 1
        if state.waiting == 0:
            self._settle(state)

    # ---- a tp_plan's tail ------------------------------------------------------------------
    def _settle(self, state: _Choice) -> None:
        """Every member of ``state`` is resolved. A plan whose states alone exceed the device is priced only where
        nothing else of its tp_plan was (the most frugal): its cost is what the memory-budgeted TP retry starts from.
        A plan whose activations or sends overflow too is priced after all only where that retry reads the least
        priced peak: at tp > 1 where nothing priced fits, and then only until that least peak is known
        (:meth:`_price_held`). Then that retry (:meth:`_retry`)."""
        retry_next, priced_any = state.first and state.group.degrees.tp > 1, bool(state.priced or state.held)
        if state.held and retry_next and not any(c.feasible for c in state.priced):
            self._price_held(state)
        self._set_aside(state, state.too_big, priced_any=priced_any)
        self._set_aside(state, state.held, priced_any=True)
        if retry_next:
            self._retry(state)

    def _price_held(self, state: _Choice) -> None:
        """Price ``state``'s held plans in order of their floors (a twin's counted, each read lazily:
        solve/stage_floor.py floor_order) until the least peak priced is below the next floor: every plan left
        peaks above it, so the retry's most frugal plan, the first of the least peak in the order the plans were
        held, is priced (docs/ilp.md, "Memory floor"). The plans priced keep that order among the priced plans and
        the rows; the others stay held."""
        s, held, first_row, first_priced = self.search, state.held, len(self.search.candidates), len(state.priced)
        least = min((c.cost.peak_memory_bytes for c in state.priced), default=math.inf)
        rows, priced = {}, {}  # by the plan's place in ``held``: its rows, and those with a Cost
        for floor, i in stage_floor.floor_order(s, held):
            if least < floor * (1 - FLOOR_ROUNDING):
                break
            row, known = len(s.candidates), len(state.priced)
            self._price(state, held[i][1], held[i][2])
            rows[i], priced[i] = s.candidates[row:], state.priced[known:]
            least = min([least] + [c.cost.peak_memory_bytes for c in priced[i]])
        s.candidates[first_row:] = [c for i in sorted(rows) for c in rows[i]]
        state.priced[first_priced:] = [c for i in sorted(priced) for c in priced[i]]
        state.held = [item for i, item in enumerate(held) if i not in rows]

    def _set_aside(self, state: _Choice, too_big: list, *, priced_any: bool) -> None:
        s = self.search
        if too_big and not priced_any:  # it cannot fit: its memory is what the retry starts from
            frugal = min(too_big, key=lambda item: item[0])
            too_big = [item for item in too_big if item is not frugal]
            self._price(state, frugal[1], frugal[2])
        for floor, plan, sub, why in too_big:
            s.candidates.append(candidates.memory_pruned_row(plan, sub, floor, s._usable_bytes, why=why))

    def _retry(self, state: _Choice) -> None:
        """Where nothing priced of the group's first tp_plan fits, its ILP again within the memory of the most frugal
        plan: a new tp_plan bounded and expanded in turn, or the reason none exists added to the rows."""
        s, priced = self.search, state.priced
        if not priced or any(c.feasible for c in priced):
            return
        frugal = min(priced, key=lambda c: c.cost.peak_memory_bytes)
        model = s.cost_model
        budget = memory_budget(model.graph, s.profile, plan=frugal.plan, cost=frugal.cost, node_times=model.node_times)
        retry = s._choose(state.group, budget=budget, zero=frugal.plan.zero_stage)  # the frugal plan's stage, dtypes
        if retry.feasible and retry.tp_plan != state.choice.tp_plan:
            self._bound_choice(_Choice(state.group, state.bound, retry, first=False, dp_choices=state.dp_choices))
        elif not retry.feasible:
            for c in priced:
                c.reason = f"{c.reason}; {retry.reason}" if c.reason else retry.reason

    @contextlib.contextmanager
    def _floors(self):
        """Members bounded (not priced) with a recompute budget's floor: see :class:`_AnyBudget`."""
        budgets = self.search.budgets
        self.search.budgets = _AnyBudget(self.search)
        try:
            yield
        finally:
            self.search.budgets = budgets


def _fields(base: Plan) -> dict:
    """The Group.plan arguments of a stage option (member_bounds.options' plan without ZeRO or stages)."""
    fields = dict(recompute=base.recompute, schedule=base.schedule, v=base.virtual_stages, steps=base.schedule_steps)
    return {**fields, "tp_overlap": base.tp_comm_overlap}  # steps: its entry k (solve/schedule_steps.py)


class _Rebound:
    """A member's bound (2) as the budgets stand when called (member_bounds.member_bound of ``args``: search, group,
    plan, (stages, its option's bound, sends, ZeRO choice), extras), and its states floor, its option's
    (member_bounds.states_floor_bytes): the pass asks it of a member up to three times."""

    __slots__ = ("args",)

    def __init__(self, *args: Any) -> None:
        self.args = args

    def __call__(self) -> float:
        return member_bounds.member_bound(*self.args)

    def states_floor_bytes(self) -> float:
        search, _, plan, at, extras = self.args
        return member_bounds.states_floor_bytes(search, plan, at, extras)


class _AnyBudget:
    """A member that recomputes and may yet be fitted a budget (member_bounds.may_budget) is keyed by the stage times of
    no recompute, the floor of every budget (solve/recompute_budget.py): whether the search fits it one depends on a
    plan without recompute that may not be priced yet. The others by the stage times the budgets give now."""

    def __init__(self, search: Any) -> None:
        self._search, self._budgets = search, search.budgets
        self.searched = self._budgets.searched

    def timing(self, plan: Plan, members: Callable[[], list[Plan]] | None = None, *, states_fit=None) -> Plan:
        """``members``: makes ``plan``'s ZeRO and sync variants, which share its recompute (BudgetBounds.timing);
        ``states_fit``: whether any of their states alone fit, where the caller knows it (member_bounds)."""
        if self.searched and plan.recompute != "none":  # may_budget's first tests: the same for every member
            if states_fit is None:
                usable, floor = self._search._usable_bytes, self._search.bounds.states_floor_bytes
                states_fit = any(floor(p) <= usable for p in (members() if members else [plan]))
            if states_fit:
                return Plan.unchecked(**{**plan.__dict__, "recompute": "none"})
        return self._budgets.timing(plan, members)

    def fitted(self, model: Any, plan: Plan, feasible: bool) -> Plan | None:
        return self._budgets.fitted(model, plan, feasible)
