"""One rule for which plans a recompute budget is fitted to (solve/recompute_budget.py): a member whose plan without
recompute does not fit, however the search finds that out: priced, set aside by a floor at its entry schedule step,
or skipped by a floor at a larger one (solve/schedule_steps.py ``floors_fit``, ``next_fitting``; Search.held_short).
Until 2026-12 a skipped larger step was not recorded, so the pruned search fitted fewer budgets than the search that
prices everything, and its ranked rows missed budgeted plans that an exhaustive run ranks."""

from __future__ import annotations

import pytest
from synthetic import synthetic_gpt, synthetic_profile
from synthetic.exhaustive import priced_everything

from autoplan.solve import schedule_steps
from autoplan.solve.candidates import SearchOptions
from autoplan.solve.pins import parse_fixes
from autoplan.solve.recompute_budget import _member
from autoplan.solve.search import Search

#: long sequences on a device the fastest plans overflow: the chain steps plans to larger schedule steps
GRAPH = synthetic_gpt(layers=8, hidden=256, heads=8, vocab=512, seq=512, batch=16)
CASES = {"one micro-batch size": (0.05, "tp=1,pp=2,mbs=1"), "any micro-batch size": (0.06, "tp=1,pp=2")}


def _ranked(result) -> list[tuple]:
    rows = sorted((c for c in result.candidates if c.feasible), key=lambda c: c.objective)
    return [(c.plan.describe(), tuple(c.plan.recompute_blocks), c.cost.step_time_s) for c in rows]


@pytest.mark.parametrize("case", CASES)
def test_the_pruned_search_fits_the_budgets_an_exhaustive_run_fits(case):
    """keep exceeds the plans that fit, so the exact top k is every plan that fits: the same rows, budgets and step
    times, budgeted plans at larger schedule steps among them."""
    gib, fixes = CASES[case]
    options = SearchOptions(devices=4, batch_size=16, fixes=parse_fixes(fixes), keep=10_000)
    profile = synthetic_profile(memory_bytes=int(gib * 2**30))
    pruned = _ranked(Search(GRAPH, profile, options).run())
    every = _ranked(priced_everything(Search(GRAPH, profile, options)).run())
    assert pruned == every
    assert sum(budget != () and "steps=" in plan for plan, budget, _ in every) >= 10


def test_next_fitting_records_every_step_it_skips_short():
    """A plan without recompute whose states fit (else no budget fits either): each larger step below the one the
    chain goes to is recorded short (its peak there is over the device), the one it goes to is not."""
    options = SearchOptions(devices=4, batch_size=16, fixes=parse_fixes("tp=1,pp=2,mbs=1"))
    search = Search(GRAPH, synthetic_profile(memory_bytes=int(0.05 * 2**30)), options)
    every = priced_everything(Search(GRAPH, synthetic_profile(), options)).run()
    members = [c.plan for c in every.candidates if c.cost and c.plan.recompute == "none" and c.plan.schedule_steps == 1]
    members = [plan for plan in members if search.bounds.states_floor_bytes(plan) <= search._usable_bytes]
    skipped = 0
    for plan in members:
        stepped = schedule_steps.next_fitting(search, plan)
        below = [k for k in schedule_steps.larger_steps(plan) if stepped is None or k < stepped.schedule_steps]
        for k in below:
            assert _member(schedule_steps.with_steps(plan, k)) in search.budgets._short
        if stepped is not None:
            assert _member(stepped) not in search.budgets._short
        skipped += len(below)
    assert skipped >= 4
