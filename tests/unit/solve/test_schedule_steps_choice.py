"""The unpinned search offers ``schedule_steps`` k > 1 (solve/schedule_steps.py): exactly, its best plan, price and
exact top k those of a search that prices every plan at every k its micro-batches and schedule allow; at equal layout
a larger k never lowers the step time and never raises the peak, the rule its pruning rests on."""

from __future__ import annotations

from dataclasses import replace
from functools import cache

import pytest
from synthetic import synthetic_gpt, synthetic_profile
from synthetic.exhaustive import priced_everything

from autoplan.cost import usable_bytes
from autoplan.solve.candidates import SearchOptions
from autoplan.solve.pins import parse_fixes
from autoplan.solve.schedule_steps import larger_steps, settles, with_steps
from autoplan.solve.search import Search

GIB = 2**30
#: long sequences, narrow blocks and many micro-batches: the receive slots and sends weigh (test_sends_floor.py)
NARROW = synthetic_gpt(layers=8, hidden=128, heads=4, vocab=512, seq=1024, batch=32)
WIDE = synthetic_gpt(layers=8, hidden=1024, heads=16, vocab=1024, seq=1024, batch=8)
SMALL = synthetic_profile(memory_bytes=int(0.06 * GIB))
#: (graph, device GiB, devices, pins, keep, whether the best runs k > 1)
CASES = {
    "gpipe in 8 steps": (WIDE, 1.0, 2, "tp=1,pp=2,precision=bf16", 1, True),
    "a smaller budget at 2 steps": (WIDE, 1.2 * GIB / usable_bytes(GIB), 2, "tp=1,pp=2,mbs=2,precision=bf16", 1, True),
    "interleaved in 4 steps": (NARROW, 0.06, 8, "pp=4,mbs=1,tp=1,schedule=interleaved_1f1b,recompute=none", 1, True),
    "one step fits": (NARROW, 0.06, 8, "pp=4,mbs=1,tp=1", 1, False),
    "one step fits, top 3": (NARROW, 0.06, 8, "pp=4,mbs=1,tp=1", 3, False),
}


def _search(name: str, *, every: bool = False, settle: bool = True) -> Search:
    graph, gib, devices, pins, keep, _ = CASES[name]
    options = SearchOptions(devices=devices, batch_size=graph.batch_size, fixes=parse_fixes(pins), keep=keep)
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
    assert {c.plan.schedule_steps for c in every.candidates if c.plan is not None} > {1}


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
