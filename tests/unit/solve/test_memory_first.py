"""Memory before time (solve/memory_first.py): a plan whose priced memory does not fit is a pruned row that says
what it needs, its time not priced; every plan that fits, the retries among them, is priced as when every plan's
time was, so the best plan and its price are unchanged."""

from __future__ import annotations

from dataclasses import replace

import pytest
from synthetic import synthetic_gpt, synthetic_host, synthetic_profile

from autoplan.solve.candidates import SearchOptions
from autoplan.solve.outputs import plans_csv
from autoplan.solve.pins import parse_fixes
from autoplan.solve.search import Search

#: activations, not the logits, fill the device: the fastest plans do not fit, slower ones do (and offload)
GRAPH = synthetic_gpt(layers=8, hidden=256, heads=8, vocab=512, seq=512, batch=16)
PROFILE = replace(synthetic_profile(memory_bytes=int(0.15 * 2**30)), host=synthetic_host())
OPTIONS = SearchOptions(devices=4, batch_size=16, fixes=parse_fixes("mbs=4"), keep=3)


def _run(memory_first: bool):
    search = Search(GRAPH, PROFILE, OPTIONS)
    search.memory_first = memory_first
    return search.run()


@pytest.fixture(scope="module")
def runs():
    return _run(True), _run(False)


def _fitting(result) -> dict[str, float]:
    return {c.plan.describe(): c.objective for c in result.candidates if c.feasible}


def test_plans_that_do_not_fit_are_not_timed_and_say_what_they_need(runs):
    first, timed = runs
    rows = [c for c in first.candidates if c.cost is not None and c.objective is None]
    assert rows and all(c.status == "evaluated" and not c.cost.feasible and c.cost.step_time_s == 0 for c in rows)
    assert all(c.reason.startswith("needs") and "GiB per device" in c.reason for c in rows)
    unfit = {str(c.config): c.reason for c in timed.candidates if c.cost is not None and not c.cost.feasible}
    assert {str(c.config): c.reason for c in rows} == unfit  # the same plans, and the same reasons
    assert all(c.objective is not None for c in timed.candidates if c.cost is not None)
    assert first.evaluated == timed.evaluated
    assert any(c.plan.offload_activations for c in first.candidates if c.feasible)  # the offload retry still runs
    lines = plans_csv(first).splitlines()
    header, unfit_line = lines[0].split(","), next(line for line in lines if ",False,," in line).split(",")
    assert unfit_line[header.index("step_time_s")] == "" and float(unfit_line[header.index("peak_memory_bytes")]) > 0


def test_the_best_plan_and_every_fitting_plan_are_those_of_timing_every_plan(runs):
    first, timed = runs
    assert first.best.describe() == timed.best.describe()
    assert first.best_cost.step_time_s == timed.best_cost.step_time_s
    assert _fitting(first) == _fitting(timed)
    assert [c.objective for c in first.ranked()[:3]] == [c.objective for c in timed.ranked()[:3]]
