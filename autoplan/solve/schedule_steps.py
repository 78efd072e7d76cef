"""Schedule steps in the unpinned search (``Plan.schedule_steps`` k; types/schedule_steps.py, docs/ilp.md "Schedule
steps"): a member's layout is searched at k = 1, and at the next k that divides its micro-batches only where no
plan of that k settles every larger one.

At equal layout (stages included) a larger k never lowers the step time and never raises the peak
(tests/unit/solve/test_schedule_steps_choice.py prices every plan of a space at every k): the bubble, fill and
drain sends and EP pairing repeat k times at m / k (cost/model.py), ZeRO-2/3's per-step messages k times
(cost/dp/messages.py), a recomputing block re-runs as often per micro-batch or more (cost/pp/reruns.py), the rest
is the m micro-batches' as before; the memory is one schedule step's, falling with its micro-batches. So a plan
priced at k that fits with its own stages (not repartitioned within memory: a tighter memory at a larger k may
admit a faster partition) settles every larger k of its layout: each fits with the same stages, no faster. Where
the search may fit it a recompute budget (solve/recompute_budget.py), a larger k may admit a smaller one, so a
recomputing plan settles only once its plan without recompute fitted at that k. Else the next k is searched: the
member at the next k whose memory floors (one schedule step's) fit, keyed by its own bound (2)
(solve/member_bounds.py ``steps_bound``), so it is priced only where that bound is not beaten. A member whose
floors exceed the device at k = 1 is searched at the first k whose floors fit. Only where k is not pinned, on a
pipeline, under a runtime that runs torch's schedules (TORCH_PIPELINES), at the k whose m / k the plan's schedule
runs (Plan's checks). A schedule that runs m / k but not m (interleaved_zb: torch's max(1, m // p) rounds must
divide m, types/schedules.py) enters at its least such k (:func:`schedule_entries`), partitioned there.
"""

from __future__ import annotations

import functools
from typing import Any

from autoplan.errors import PlanError
from autoplan.solve import activation_offload
from autoplan.solve.candidates import config_of
from autoplan.solve.schedules import schedule_options
from autoplan.types.plan import Plan
from autoplan.types.schedule_steps import check_schedule_steps
from autoplan.types.schedules import TORCH_PIPELINES, check_schedule


def searched(fixes: dict, runtime: str) -> bool:
    """Whether the search offers k > 1 of its own: k not pinned, a runtime that runs torch's schedules."""
    return "schedule_steps" not in fixes and runtime in TORCH_PIPELINES


def schedule_entries(*, pp: int, layers: int, m: int, k: int, fixes: dict, runtime: str) -> tuple:
    """(schedule, virtual stages, entry k) of a group of ``m`` micro-batches at ``k`` schedule steps: its schedules
    at m / k (solve/schedules.py) entering at k; where the search offers k > 1 (:func:`searched`), on a pipeline,
    each schedule that runs no smaller j's m / j enters at the least j that divides m whose m / j it runs."""
    pins = tuple((name, fixes[name]) for name in ("schedule", "v") if name in fixes)
    return _entries(pp, layers, m, k, pins, runtime, pp > 1 and searched(fixes, runtime))


@functools.lru_cache(maxsize=4096)
def _entries(pp: int, layers: int, m: int, k: int, pins: tuple, runtime: str, stepped: bool) -> tuple:
    """:func:`schedule_entries` by what it reads (``pins``: the schedule and v pins schedule_options reads)."""
    found: dict = {}
    for j in (j for j in range(k, m + 1) if m % j == 0) if stepped else (k,):
        for sv in schedule_options(pp=pp, layers=layers, num_microbatches=m // j, fixes=dict(pins), runtime=runtime):
            found.setdefault(sv, j)
    return tuple((s, v, j) for (s, v), j in found.items())


def entry_steps(plan: Plan, k: int) -> int:
    """The least schedule steps j >= ``k`` (its group's) whose m / j ``plan``'s schedule runs: where its member
    enters the search (:func:`schedule_entries`); ``k`` where none does (pp = 1, or another runtime)."""
    found = _larger_steps(plan.num_microbatches, k - 1, plan.pp, plan.virtual_stages, plan.schedule, plan.runtime)
    return found[0] if found else k


def enters(plan: Plan, k: int) -> bool:
    """Whether ``plan`` is its member's entry into the search (:func:`entry_steps`) in a group of ``k`` steps."""
    return plan.schedule_steps == k or plan.schedule_steps == entry_steps(plan, k)


def larger_steps(plan: Plan) -> tuple[int, ...]:
    """The k > ``plan.schedule_steps`` whose m / k its schedule runs (types/schedule_steps.py and types/schedules.py:
    the only checks of a Plan that read k), ascending; none at pp = 1 or under another runtime."""
    return _larger_steps(plan.num_microbatches, plan.schedule_steps, plan.pp, plan.virtual_stages, plan.schedule,
                         plan.runtime)  # fmt: skip


@functools.lru_cache(maxsize=4096)
def _larger_steps(m: int, k: int, pp: int, v: int, schedule: str, runtime: str) -> tuple[int, ...]:
    """:func:`larger_steps` by the fields those checks read; only the j that divide m are probed, as
    check_schedule_steps refuses every other j > 1 first, whatever the plan."""
    fields = dict(devices=pp, dp=1, tp=1, pp=pp, micro_batch_size=1, num_microbatches=m, schedule=schedule)
    found = []
    for j in (j for j in range(k + 1, m + 1) if m % j == 0) if pp > 1 else ():
        try:  # a probe a Plan refuses is a k that does not run, however it is built (checked or not)
            probe = Plan.unchecked(**fields, virtual_stages=v, runtime=runtime, schedule_steps=j)
            check_schedule_steps(probe)
            check_schedule(probe)
        except PlanError:
            continue
        found.append(j)
    return tuple(found)


def with_steps(plan: Plan, k: int) -> Plan:
    """``plan`` (its stages kept) as ``k`` schedule steps (one of :func:`larger_steps`), unchecked as the search's
    members are: a copy of its fields, as Plan.unchecked makes it."""
    stepped = Plan.__new__(Plan)
    stepped.__dict__.update(plan.__dict__)
    stepped.schedule_steps = k
    return stepped


def floors_fit(search: Any, plan: Plan, *, states_bytes: float | None = None) -> bool:
    """Whether ``plan``'s memory floors fit the device: its states alone (``states_bytes``: its
    Bounds.states_floor_bytes where the caller has it), and with its activations in flight or its sends
    (Search._over_floor's, of one schedule step); a plan held by the latter is recorded short for the recompute
    budgets (Search.held_short), as at its entry step."""
    if not _states_fit(search, plan, states_bytes):
        return False
    if _held_fits(search, plan):
        return True
    search.held_short(plan)
    return False


def _states_fit(search: Any, plan: Plan, states_bytes: float | None) -> bool:
    """Whether ``plan``'s states alone fit the device, which no k changes: read from ``states_bytes`` where given
    (a member's is its option's, solve/member_bounds.py states_floor_bytes), else computed."""
    states_bytes = search.bounds.states_floor_bytes(plan) if states_bytes is None else states_bytes
    return states_bytes <= search._usable_bytes


def _held_fits(search: Any, plan: Plan) -> bool:
    """Whether Search.held_floor_bytes of ``plan`` fits the device, its sends' floor read only where the floor with
    its activations in flight does."""
    usable, offload = search._usable_bytes, activation_offload.may_offload(plan, search.profile, search.fixes)
    if search.bounds.memory_floor_bytes(plan, offload=offload) > usable:
        return False
    return offload or search.bounds.sends.floor_bytes(plan) <= usable


def next_fitting(search: Any, plan: Plan, *, states_bytes: float | None = None) -> Plan | None:
    """``plan`` at the least larger k whose memory floors fit (Search._over_floor's, of one schedule step), or None
    where none can fit: the states alone (which no k changes; ``states_bytes``: as :func:`floors_fit`'s, read first,
    so a member set aside by them costs no probe) exceed the device, or the floor at the largest k does.
    A floor at k bounds the peak at k under every partition, and the peak at every smaller k (it falls with k at
    equal stages: tests/unit/solve/test_schedule_steps_choice.py), so a k whose floor exceeds the device rules out
    every smaller k: bisected so (a floor itself need not fall with k). Each k below the one returned (every k where
    None is) is recorded short for the recompute budgets (Search.held_short), as pricing it would find it."""
    if not _states_fit(search, plan, states_bytes) or not (steps := larger_steps(plan)):
        return None
    low, high = 0, len(steps) - 1  # the least index whose floor fits lies in [low, high], if the last's does
    if not _held_fits(search, last := with_steps(plan, steps[high])):
        low = len(steps)
    while low < high:
        middle = (low + high) // 2
        if _held_fits(search, with_steps(plan, steps[middle])):
            high = middle
        else:
            low = middle + 1
    for k in steps[:low] if plan.recompute == "none" else ():  # each over the device: recorded short
        search.held_short(with_steps(plan, k))
    if low == len(steps):
        return None
    return last if low == len(steps) - 1 else with_steps(plan, steps[low])


def settles(search: Any, plan: Plan, fitted: bool) -> bool:
    """Whether ``plan`` (priced at its k; ``fitted``: it fit with its own stages) settles every larger k of its
    layout (module docstring); a plan of no recompute that fit is recorded for its recomputing siblings."""
    if not search.steps_settle or not fitted:
        return False
    if plan.recompute == "none":
        search.steps_fitted.add(_sibling(plan))
        return True
    return not search.budgets.searched or bool(plan.recompute_blocks) or _sibling(plan) in search.steps_fitted


def _sibling(plan: Plan) -> tuple:
    """``plan``'s place in the search but for its recompute (and partition): its plan of no recompute under the
    same tp_plan has the same (solve/recompute_budget.py pairs them so, but for the tp_plan)."""
    place = tuple(value for key, value in config_of(plan).items() if key != "recompute")
    return place + (repr(sorted(plan.tp_plan.items())),)
