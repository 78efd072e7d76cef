"""The unpinned search offers ``schedule_steps`` k > 1 (solve/schedule_steps.py): exactly, its best plan, price and
exact top k those of a search that prices every plan at every k its micro-batches and schedule allow, a zero-bubble
schedule that runs m / k but not m among them; at equal layout a larger k never lowers the step time and never raises
the peak, the rule its pruning rests on."""

from __future__ import annotations

import contextlib
from dataclasses import replace
from functools import cache

import pytest
from synthetic import synthetic_gpt, synthetic_profile
from synthetic.exhaustive import priced_everything

from autoplan.cost import usable_bytes
from autoplan.errors import PlanError
from autoplan.solve.candidates import SearchOptions
from autoplan.solve.pins import parse_fixes
from autoplan.solve.schedule_steps import enters, entry_steps, larger_steps, schedule_entries, settles, with_steps
from autoplan.solve.search import Search
from autoplan.types.schedule_steps import schedule_step_plan

GIB = 2**30
#: long sequences, narrow blocks and many micro-batches: the receive slots and sends weigh (test_sends_floor.py)
NARROW = synthetic_gpt(layers=8, hidden=128, heads=4, vocab=512, seq=1024, batch=32)
WIDE = synthetic_gpt(layers=8, hidden=1024, heads=16, vocab=1024, seq=1024, batch=8)
#: one block per stage at pp = 4 (one partition at every k) and wide blocks: a zero-bubble bubble pays; 30 and 14
#: micro-batches, whose max(1, m // 4) rounds (4 and 3) do not divide them, are run by interleaved_zb only at k > 1
ZB30, ZB14 = (synthetic_gpt(layers=4, hidden=2048, heads=16, vocab=1024, seq=512, batch=m) for m in (30, 14))
ZB_PINS = "tp=1,pp=4,mbs=1,precision=bf16"
SMALL = synthetic_profile(memory_bytes=int(0.06 * GIB))
#: (graph, device GiB, devices, pins, keep, whether the best runs k > 1)
CASES = {
    "gpipe in 8 steps": (WIDE, 1.0, 2, "tp=1,pp=2,precision=bf16", 1, True),
    "a smaller budget at 2 steps": (WIDE, 1.2 * GIB / usable_bytes(GIB), 2, "tp=1,pp=2,mbs=2,precision=bf16", 1, True),
    "interleaved in 4 steps": (NARROW, 0.06, 8, "pp=4,mbs=1,tp=1,schedule=interleaved_1f1b,recompute=none", 1, True),
    "one step fits": (NARROW, 0.06, 8, "pp=4,mbs=1,tp=1", 1, False),
    "one step fits, top 3": (NARROW, 0.06, 8, "pp=4,mbs=1,tp=1", 3, False),
    "zero bubble at 2 steps": (ZB30, 1.5, 4, ZB_PINS, 1, True),
    "zero bubble at 2 steps, top 3": (ZB30, 1.5, 4, ZB_PINS, 3, True),
    "zero bubble at 2 steps, 8 GiB": (ZB14, 8.0, 4, ZB_PINS, 1, True),
    "zero bubble pinned, at 3 steps": (ZB30, 1.4, 4, ZB_PINS + ",schedule=interleaved_zb", 1, True),
    "zero bubble pinned, recomputing at 6 steps": (ZB30, 1.3, 4, ZB_PINS + ",schedule=interleaved_zb", 1, True),
}
#: the cases whose best is a zero-bubble plan that its m does not run
ZERO_BUBBLE = [name for name in CASES if name.startswith("zero bubble")]


def _search(name: str, *, every: bool = False, settle: bool = True, pins: str = "") -> Search:
    graph, gib, devices, fixes, keep, _ = CASES[name]
    fixes = parse_fixes(fixes + pins)
    options = SearchOptions(devices=devices, batch_size=graph.batch_size, fixes=fixes, keep=keep)
    search = Search(graph, synthetic_profile(memory_bytes=int(gib * GIB)), options)
    if every:  # every plan at every k, whatever its bound or memory floor
        priced_everything(search).steps_settle = False
    search.steps_settle &= settle
    return search


@cache
def _every(name: str):
    return _search(name, every=True).run()


@pytest.mark.parametrize("name", list(CASES))
def test_the_search_is_the_one_that_prices_every_plan_at_every_k(name):
    keep, steps = CASES[name][4], CASES[name][5]
    pruned, every = _search(name).run(), _every(name)
    assert (pruned.best.describe(), pruned.best.stages) == (every.best.describe(), every.best.stages)
    assert pruned.best_cost.step_time_s == every.best_cost.step_time_s
    assert [c.objective for c in pruned.ranked()[:keep]] == [c.objective for c in every.ranked()[:keep]]
    assert (pruned.best.schedule_steps > 1) == steps
    assert len({c.plan.schedule_steps for c in every.candidates if c.plan is not None}) > 1


@pytest.mark.parametrize("name", ZERO_BUBBLE)
def test_a_zero_bubble_schedule_that_runs_only_at_k_over_1_is_found_as_every_pinned_k_prices_it(name):
    """Against a search that prices every plan at every k by other means (each k pinned, --fix schedule_steps=k,
    every plan priced; one partition at every k here): the same best plan and price, an interleaved_zb plan whose
    m its schedule does not run (before, the unpinned search offered it only pinned)."""
    m = CASES[name][0].batch_size
    pinned = []
    for k in (k for k in range(1, m + 1) if m % k == 0):
        with contextlib.suppress(PlanError):  # no schedule runs m / k: no group
            if (found := _search(name, every=True, pins=f",schedule_steps={k}").run()).best is not None:
                pinned.append(found)
    every = min(pinned, key=lambda r: r.best_cost.step_time_s)
    pruned = _search(name).run()
    assert (pruned.best.describe(), pruned.best.stages) == (every.best.describe(), every.best.stages)
    assert pruned.best_cost.step_time_s == every.best_cost.step_time_s
    assert pruned.best.schedule == "interleaved_zb" and pruned.best.schedule_steps > 1
    with pytest.raises(PlanError, match="rounds of equal size"):
        replace(pruned.best, schedule_steps=1)
    priced = [c for r in [*pinned, _every(name)] for c in r.candidates if c.cost is not None and c.plan is not None]
    assert all(c.lower_bound <= c.objective * (1 + 1e-12) for c in priced)  # no bound above its price


def test_a_member_that_enters_at_k_over_1_has_its_row_priced_or_pruned():
    """Each member has one row at the k it enters at (schedule_steps.entry_steps: 1, or 2 for interleaved_zb at 14
    micro-batches), priced or pruned, as in the search that prices everything; a larger k's only where priced."""
    name = "zero bubble at 2 steps, 8 GiB"
    pruned, full = _search(name).run(), _every(name)

    def entered(result, status: str) -> int:  # rows at the k their member enters at (a pruned row is one)
        rows = [c for c in result.candidates if c.status == status]
        return sum(c.count for c in rows if c.plan is None or enters(c.plan, 1))

    assert full.pruned == 0 and pruned.pruned > 0
    assert entered(full, "evaluated") == entered(pruned, "evaluated") + entered(pruned, "pruned")
    steps = {c.config.get("schedule_steps", 1) for c in pruned.candidates if c.status == "pruned"}
    assert 2 in steps  # interleaved_zb's rows at 2


def test_the_pinned_zero_bubble_bound_under_recompute_reads_the_re_runs_of_one_schedule_step():
    """StageCosts.bubble_floor of a recomputing interleaved_zb plan (member_bounds' at a pinned k) reads its re-runs
    per micro-batch at m: the same as at one schedule step's m / k (cost/pp/reruns.py: 2 in every split chunk, 1 in
    chunk 0, whatever m), so the floor at m is the floor of each of its steps; every such plan priced at a pinned k is
    priced above its bound."""
    name = "zero bubble pinned, recomputing at 6 steps"
    search, plans = _search(name), []
    for k in (3, 5, 6):
        found = _search(name, every=True, pins=f",schedule_steps={k}").run()
        plans += [c for c in found.candidates if c.cost is not None and c.plan.recompute != "none"]
    assert {c.plan.schedule_steps for c in plans} == {3, 5, 6} and {c.plan.recompute for c in plans} > {"full"}
    floor = search.stage_costs.bubble_floor
    for c in plans:
        assert floor(c.plan) == floor(schedule_step_plan(c.plan)) > 0, c.plan.describe()
        assert c.lower_bound <= c.objective, c.plan.describe()


def test_a_plan_that_fits_settles_its_larger_steps_and_a_budget_waits_for_its_plan_without_recompute():
    """schedule_steps.settles: a plan that fit with its own stages settles; one that did not, or was repartitioned
    (``fitted`` False), does not; a recomputing plan under searched budgets settles only once its plan without
    recompute settled at that k (a larger k may fit it a smaller budget); with ``steps_settle`` off nothing does."""
    search = _search("a smaller budget at 2 steps")
    best = _every("a smaller budget at 2 steps").best
    none, full = (replace(best, recompute=r, recompute_blocks=[]) for r in ("none", "full"))
    assert search.budgets.searched and not settles(search, none, False)
    assert not settles(search, full, True)  # its plan without recompute not known to fit
    assert settles(search, none, True) and settles(search, full, True)
    assert not settles(search, replace(full, schedule_steps=1), True)  # another k: another sibling
    search.steps_settle = False
    assert not settles(search, none, True)


@pytest.mark.parametrize("name", ["gpipe in 8 steps", "one step fits"])
def test_time_rises_and_memory_falls_with_k_at_equal_layout(name):
    """Every pipelined plan the exhaustive search priced at k = 1, at each k that divides its micro-batches and that
    its schedule runs, with its stages: step time non-decreasing, peak and memory floors non-increasing."""
    search = _search(name)
    model, plans, seen = search.cost_model, [], set()
    for c in _every(name).candidates:
        plan = c.plan
        if plan is None or plan.pp == 1 or plan.schedule_steps > 1 or repr(plan) in seen:
            continue
        seen.add(repr(plan))
        plans.append(plan)
    plans = [p for p in plans if larger_steps(p)]
    assert len(plans) > 20 and len({(p.schedule, p.recompute) for p in plans}) > 3
    for plan in plans:
        steps = [plan] + [with_steps(plan, k).checked() for k in larger_steps(plan)]
        costs = [model.estimate(p) for p in steps]
        times = [c.step_time_s for c in costs]
        peaks = [c.peak_memory_bytes for c in costs]
        assert times == sorted(times), plan.describe()
        assert peaks == sorted(peaks, reverse=True), plan.describe()
        # a floor need not fall with k (it is one of every partition's), but bounds its own peak, so the peak of
        # every smaller k: schedule_steps.next_fitting rules those out by it
        for p, peak in zip(steps, peaks):
            assert max(search.held_floor_bytes(p)[0], search.bounds.states_floor_bytes(p)) <= peak, p.describe()


def test_a_schedule_enters_at_the_least_k_whose_m_over_k_it_runs():
    """schedule_entries: the schedules m runs at k = 1; interleaved_zb, whose max(1, m // p) rounds (7 at m = 30,
    p = 4) do not divide m, at 2 (15 a step, 3 rounds); none at k > 1 pinned or for a runtime without torch's
    schedules; entry_steps says the same of a plan."""
    kw = dict(pp=4, layers=8, m=30, k=1)
    entries = schedule_entries(**kw, fixes={}, runtime="autoplan")
    assert ("interleaved_zb", 1, 2) in entries and ("interleaved_zb", 2, 2) in entries
    assert {j for s, _, j in entries if s != "interleaved_zb"} == {1} and ("1f1b", 1, 1) in entries
    for fixes, runtime in (({}, "megatron"), ({"schedule_steps": 1}, "autoplan")):
        assert {j for *_, j in schedule_entries(**kw, fixes=fixes, runtime=runtime)} == {1}
    plan = _every("zero bubble at 2 steps").best
    assert entry_steps(plan, 1) == 2 and enters(plan, 1) and not enters(replace(plan, schedule_steps=3), 1)
