"""Bound (2) of solve/search.py's docstring for the members of one group under one tp_plan (docs/ilp.md, section 4):

    LB2 = (m + b(schedule, v)) * T_slowest + pp_comm - hideable + optimizer(zero)                  (2)

first with the slowest stage and its parameters at their floors under any partition (:func:`options`: no partition
solved, so a stage option whose ZeRO choices this rules out costs no partition), then with the partition's own stage
times (:func:`member_bound`). Each is no less than bound (1) at the schedule's own bubble floor, and the stage times
are those of ``Search.budgets.timing``: of no recompute where a recompute budget may be fitted to the member
(solve/recompute_budget.py). ``search`` is a solve/search.py Search.

The memos here live in ``extras``, one dict per best_first.py ``_Choice``: one group and one tp_plan. Their keys
leave out what a group fixes (its degrees, micro-batch size and count m, precision, sequence parallelism): every
plan they are asked of is made by that group's Group.plan (num_microbatches = g.m), or is a budgets' timing plan
that copies it but for its recompute (tests/unit/solve/test_search_memos.py checks one m per dict).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from autoplan.solve import activation_offload, moe_overlap, schedule_steps
from autoplan.solve.candidates import Group
from autoplan.types.plan import Plan
from autoplan.types.schedule_steps import schedule_step_plan


def options(search: Any, g: Group, bound: float, choice: Any, dp_choices: list, extras: dict, pruned: list):
    """Each (tp overlap, recompute, schedule, v) of ``g`` under ``choice`` (a TPChoice) that bound (1) at its
    schedule's own bubble floor does not rule out (for those it does, (that bound, the option's fields) joins
    ``pruned``: one row each, which the caller writes where it expands the group): its plan without ZeRO or stages,
    that bound, its sends (Bounds.pp_comm_s, whether the group may offload activations), and each ZeRO choice's
    bound (2) whatever the stages (:func:`whatever_the_stages`)."""
    deg, names = g.degrees, dict(model=search.graph.model_name, profile=search.profile.name)
    own_bounds = {}  # bound (1) at each schedule's own bubble floor
    share = search.bounds.zero_bubble_share(tp=deg.tp, precision=g.precision, mbs=g.mbs, cp=deg.cp)
    per_microbatch_s, adam_s = search.bound_parts_s(g)
    offload = None  # whether the group's plans may offload activations (StageCosts.bubble_floor)
    for overlap, recompute, (schedule, v, steps) in search._stage_options(g):
        kw = dict(recompute=recompute, schedule=schedule, v=v, tp_overlap=overlap, steps=steps)
        base = g.plan(zero=0, tp_plan=choice.tp_plan, **kw, **names)
        if (schedule, v) not in own_bounds:
            b = g.least_bubble([(schedule, v)], pp=deg.pp, share=share)
            own_bounds[schedule, v] = max(bound, search.objective((g.m + b) * per_microbatch_s + adam_s, deg.devices))
        if search._beaten(own := own_bounds[schedule, v]):  # every ZeRO choice of it: one row
            pruned.append((own, _known(g, steps, recompute=recompute, schedule=schedule, v=v, tp_overlap=overlap)))
            continue
        pp_comm_s = _pp_comm_s(search, base, extras)  # (2)'s sends: the same for each ZeRO choice
        if offload is None:  # the same for every member: tp, cp, ep, compile, runtime
            offload = activation_offload.may_offload_a_twin(base, search.profile, search.fixes)
        sends = (pp_comm_s, offload)
        yield base, own, sends, whatever_the_stages(search, g, base, own, dp_choices, extras, sends)


def whatever_the_stages(search: Any, g: Group, base: Plan, bound: float, dp_choices, extras, sends) -> list[float]:
    """Bound (2) of each ZeRO choice of ``base``'s stage option with the slowest stage and its parameters at their
    floors under any partition (Bounds.stage_params_floor), under Pass._floors' budgets. ``extras``: what one
    tp_plan's options of one tp overlap share (:func:`_per_overlap`); ``sends``: (Bounds.pp_comm_s, whether the
    group may offload activations). A ZeRO choice's plan is made only where it is read: the first of each ZeRO
    stage's (:func:`_first_per_zero`) where the bubble floor reads the ZeRO stage (StageCosts.bubble_reads_context),
    and every one where the budgets' timing reads them."""
    pp_s, offload = sends
    kw = dict(recompute=base.recompute, schedule=base.schedule, v=base.virtual_stages, tp_plan=base.tp_plan)
    kw.update(tp_overlap=base.tp_comm_overlap, model=search.graph.model_name, profile=search.profile.name)
    kw.update(steps=base.schedule_steps)
    shared = _per_overlap(search, g, base, dp_choices, extras, kw)
    made: list[Plan] = []

    def plans() -> list[Plan]:
        made[:] = made or g.plans(dp_choices, **kw)
        return made

    timing = search.budgets.timing(base, plans, states_fit=shared.states_fit)
    floor_s = _slowest_stage_floor_s(search, timing, extras)
    if search.stage_costs.bubble_reads_context(base, may_offload=offload):  # each ZeRO stage's its own context's
        firsts = [
            g.plan(zero=zero, grads=grads, **kw)
            for zero, grads in _first_per_context(search, g, kw, dp_choices, extras)
        ]
        bubble = min((search.stage_costs.bubble_floor(p, may_offload=offload) for p in firsts), default=0.0)
    else:  # the schedule's alone: every ZeRO choice's is the base plan's
        bubble = search.stage_costs.bubble_floor(base, may_offload=offload)
    core_s = (g.m + bubble) * floor_s + pp_s
    core_s -= moe_overlap.hideable_s(search.stage_costs, base, search.fixes)  # an overlapped twin could hide it
    return [max(bound, search.objective(core_s + extra_s, g.degrees.devices)) for extra_s in shared.extras_s]


def _known(g: Group, steps: int, **fields) -> dict:
    """The row fields of a stage option its bound prunes: its schedule steps where not the group's (config_of's)."""
    return {**fields, "schedule_steps": steps} if steps != g.schedule_steps else fields


@dataclass(frozen=True)
class _Shared:
    """What every stage option of one tp_plan and tp overlap shares, by ZeRO choice (:func:`_per_overlap`)."""

    extras_s: list[float]  # Bounds.step_extras_s of each ZeRO choice at the stage parameters' floor
    states_bytes: tuple[float, ...]  # Bounds.states_floor_bytes of each ZeRO choice, with its stages or without
    states_fit: bool  # whether any ZeRO choice's states alone fit


def _per_overlap(search: Any, g: Group, base: Plan, dp_choices: list, extras: dict, kw: dict) -> _Shared:
    """:class:`_Shared` of ``base``'s tp overlap, memoised in ``extras`` (one tp_plan's): its ZeRO choices' plans
    differ from one stage option to the next only in recompute, schedule and virtual stages (and a member's in its
    stages), which Bounds.step_extras_s, stage_params_floor and states_floor_bytes do not read
    (tests/unit/solve/test_search_memos.py varies each)."""
    if (key := base.tp_comm_overlap) not in extras:
        plans = g.plans(dp_choices, **{**kw, "steps": 0})  # at the group's k, the least (_group_steps)
        params = search.bounds.stage_params_floor(base)  # each extra rises with the stage's parameters
        extras_s = [search.bounds.step_extras_s(p, stage_params=params, params_floor=params) for p in plans]
        states = tuple(search.bounds.states_floor_bytes(p) for p in plans)
        extras[key] = _Shared(extras_s, states, any(b <= search._usable_bytes for b in states))
    return extras[key]


def _first_per_zero(dp_choices: list) -> list:
    """The first (zero, grads) of each ZeRO stage of ``dp_choices``: of a ZeRO choice, StageCosts.bubble_floor reads
    its stage alone (its tp context's, solve/stage_costs.py), not its gradient sync
    (tests/unit/solve/test_group_plans.py varies each)."""
    return list({zero: (zero, grads) for zero, grads in reversed(dp_choices)}.values())


def _first_per_context(search: Any, g: Group, kw: dict, dp_choices: list, extras: dict) -> list:
    """:func:`_first_per_zero`, the first of each ZeRO stage whose tp context (StageCosts.context: its key) no earlier
    one has: StageCosts.bubble_floor reads a ZeRO stage only through its context (ZeRO-3's cast weights set the
    activations' dtypes, cost/compute/dtypes.py, the others share one), so a min over these is the min over all.
    Memoised in ``extras`` (one group's, one tp_plan's) per tp overlap, the one other field StageCosts.context reads
    that a stage option sets (``kw``: Group.plan's other keywords; tests/unit/solve/test_member_bound_memos.py)."""
    if (key := ("contexts", kw["tp_overlap"])) not in extras:
        firsts, seen = [], set()
        for zero, grads in _first_per_zero(dp_choices):
            ctx = search.stage_costs.context(g.plan(zero=zero, grads=grads, **kw)).key
            if ctx not in seen:
                seen.add(ctx)
                firsts.append((zero, grads))
        extras[key] = firsts
    return extras[key]


def _pp_comm_s(search: Any, base: Plan, extras: dict) -> float:
    """Bounds.pp_comm_s of ``base``, memoised in ``extras`` (one group's, one tp_plan's) on what it reads that a
    stage option sets: its virtual stages (the sends per step, v m + p - 1) and tp overlap (StageCosts.
    min_boundary_bytes' floor context), not its recompute, schedule or schedule steps
    (tests/unit/solve/test_member_bound_memos.py)."""
    if (key := ("sends", base.tp_comm_overlap, base.virtual_stages)) not in extras:
        extras[key] = search.bounds.pp_comm_s(base)
    return extras[key]


def _slowest_stage_floor_s(search: Any, timing: Plan, extras: dict) -> float:
    """StageCosts.slowest_stage_floor_s of ``timing`` (a budgets' timing plan), memoised in ``extras`` (one group's,
    one tp_plan's) on what it reads that a stage option sets: recompute and tp overlap (its block totals at the
    floor context), and, to be safe, the timing plan's ZeRO stage (the tp context it is priced in may read it); not
    schedule, virtual stages or schedule steps (tests/unit/solve/test_member_bound_memos.py)."""
    if (key := ("slowest floor", timing.recompute, timing.tp_comm_overlap, timing.zero_stage)) not in extras:
        extras[key] = search.stage_costs.slowest_stage_floor_s(timing)
    return extras[key]


def states_floor_bytes(search: Any, plan: Plan, at: tuple, extras: dict) -> float:
    """Bounds.states_floor_bytes of ``plan``, the ``i``-th ZeRO choice of its stage option (``at`` as
    :func:`member_bound`'s): its tp overlap's :func:`_per_overlap` value, which reads no recompute, schedule,
    virtual stages or stages (tests/unit/solve/test_search_memos.py)."""
    shared = extras.get(plan.tp_comm_overlap)
    return shared.states_bytes[at[3]] if shared is not None else search.bounds.states_floor_bytes(plan)


def member_bound(search: Any, g: Group, plan: Plan, at: tuple, extras: dict) -> float:
    """Bound (2) of ``plan``, the ``i``-th ZeRO choice of its stage option, with its partition's stage times at
    the recompute ``search.budgets`` says now; ``at``: (stages, the option's own bound, its sends, i)."""
    stages, own, (pp_comm_s, offload), i = at
    shared = extras.get(plan.tp_comm_overlap)  # its option's (whatever_the_stages): the states floor of choice i
    states_fit = shared.states_bytes[i] <= search._usable_bytes if shared is not None else None
    times, params = _stage_totals(search, plan, stages, extras, states_fit=states_fit)
    core_s = (g.m + _steps_bubble(search, g, plan, offload, extras)) * max(times) + pp_comm_s
    core_s -= moe_overlap.hideable_s(search.stage_costs, plan, search.fixes)  # its overlapped twin's
    if (key := (plan.tp_comm_overlap, i, max(params))) not in extras:  # as in whatever_the_stages
        extras[key] = search.bounds.step_extras_s(_group_steps(g, plan), stage_params=max(params))
    return max(own, search.objective(core_s + extras[key], g.degrees.devices))


def _group_steps(g: Group, plan: Plan) -> Plan:
    """``plan`` at its group's schedule steps, where the memos of step_extras_s read it: a larger k sends ZeRO-2/3's
    per-step messages k times (cost/dp/sync.py), so the group's k bounds every k of its members."""
    return plan if plan.schedule_steps == g.schedule_steps else schedule_steps.with_steps(plan, g.schedule_steps)


def _steps_bubble(search: Any, g: Group, plan: Plan, offload: bool, extras: dict) -> float:
    """:func:`_bubble_floor`, or at a schedule step k the group's search did not pin (solve/schedule_steps.py) the least
    over k and each larger k j of j times StageCosts.bubble_floor of one schedule step (types/schedule_steps.py),
    which CostModel prices j times: the floor reads the step's m / j where a zero-bubble schedule's re-runs do, and
    the member stands for its larger k until its floors are read (best_first.py). Memoised in ``extras`` as
    :func:`_bubble_floor` is, with k (tests/unit/solve/test_member_bound_memos.py)."""
    if plan.schedule_steps == g.schedule_steps:
        return _bubble_floor(search, plan, offload, extras)
    key = ("steps bubble", *_bubble_key(plan, offload), plan.schedule_steps)
    if key not in extras:
        steps = [plan] + [schedule_steps.with_steps(plan, j) for j in schedule_steps.larger_steps(plan)]
        floor = search.stage_costs.bubble_floor
        extras[key] = min(p.schedule_steps * floor(schedule_step_plan(p), may_offload=offload) for p in steps)
    return extras[key]


def _bubble_key(plan: Plan, offload: bool) -> tuple:
    """What StageCosts.bubble_floor reads of one group's and tp_plan's plan that tells its members apart (and
    schedule_steps.larger_steps, but for k): recompute, schedule, virtual stages, tp overlap and ZeRO stage (its tp
    context's), not its stages or gradient sync (tests/unit/solve/test_group_plans.py varies each)."""
    return (plan.recompute, plan.schedule, plan.virtual_stages, plan.tp_comm_overlap, plan.zero_stage, offload)


def _bubble_floor(search: Any, plan: Plan, offload: bool, extras: dict) -> float:
    """StageCosts.bubble_floor of ``plan``, memoised in ``extras`` (one tp_plan's) on :func:`_bubble_key`."""
    key = ("bubble", *_bubble_key(plan, offload))
    if key not in extras:
        extras[key] = search.stage_costs.bubble_floor(plan, may_offload=offload)
    return extras[key]


def _stage_totals(search: Any, plan: Plan, stages: list, extras: dict, *, states_fit: bool | None = None) -> tuple:
    """StageCosts.stage_totals of ``plan``'s timing plan (``search.budgets``; ``states_fit``: whether its states alone
    fit, where known) and ``stages``, memoised in ``extras`` (one tp_plan's) on what it reads that tells its members
    apart: the stages (held, so their id stays theirs), the timing plan's recompute, schedule, virtual stages, tp
    overlap and tp context (StageCosts.context: its ZeRO stage among them), not a ZeRO choice's gradient sync
    (tests/unit/solve/test_group_plans.py varies each)."""
    timing = search.budgets.timing(plan, states_fit=states_fit)
    ctx = search.stage_costs.context(timing).key
    key = ("totals", id(stages), timing.recompute, timing.schedule, timing.virtual_stages, timing.tp_comm_overlap, ctx)
    if key not in extras:
        extras[key] = (stages, search.stage_costs.stage_totals(timing, stages))
    return extras[key][1]


def own_times(search: Any, plan: Plan, rebound: Any) -> bool:
    """Whether the search bounds ``plan`` (``rebound``: best_first.py's, its bound and states floor) by its own stage
    times where its key took those of no recompute (best_first.py ``_AnyBudget``): it recomputes, could fit, and its
    plan without recompute has not been found short."""
    return may_budget(search, plan, rebound.states_floor_bytes) and search.budgets.timing(plan) is plan


def may_budget(search: Any, plan: Plan, states_bytes: Callable[[], float]) -> bool:
    """Whether a recompute budget may yet be fitted to ``plan`` (solve/recompute_budget.py): budgets are searched, it
    recomputes, and its states alone fit (``states_bytes``: its Bounds.states_floor_bytes; a budget is fitted only to
    a plan that fits)."""
    if not search.budgets.searched or plan.recompute == "none":
        return False
    return states_bytes() <= search._usable_bytes
