"""Held plans priced in order of their memory floor (solve/best_first.py ``Pass._price_held``): where nothing of a
tp > 1 group fits, the memory-budgeted TP retry reads the least priced peak, and the pass prices the plans its floors
held back only until that least peak is below the next floor. The retry starts from the same most frugal plan as when
every held plan is priced, every plan that fits is priced alike, and each plan left unpriced keeps a row that says
which floor held it (docs/ilp.md, "Memory floor")."""

from __future__ import annotations

import math

import pytest
from synthetic import synthetic_gpt, synthetic_profile

from autoplan.solve import best_first, stage_floor
from autoplan.solve.candidates import SearchOptions
from autoplan.solve.pins import parse_fixes
from autoplan.solve.search import SENT, Search
from autoplan.solve.stage_floor import StageFloors

#: test_sends_floor.py's model (the tensors sent between stages weigh) at tp = 2: groups where nothing fits
GRAPH = synthetic_gpt(layers=8, hidden=128, heads=4, vocab=512, seq=1024, batch=32)
PROFILE = synthetic_profile(memory_bytes=int(0.06 * 2**30))
OPTIONS = SearchOptions(devices=8, batch_size=32, fixes=parse_fixes("pp=4,tp=2"))


def _run(monkeypatch, *, every_held: bool, own_stages: bool = True):
    """The search, and the (plan, peak) each memory-budgeted retry started from; ``every_held``: every held plan of
    such a group priced, in the order it was held (as before the floor order); ``own_stages``: held plans ordered
    by their floor on their own stages too (solve/stage_floor.py), else by their held floor alone."""
    budgets, real = [], best_first.memory_budget

    def recorded(graph, profile, *, plan, cost, **kwargs):
        budgets.append((plan.describe(), cost.peak_memory_bytes))
        return real(graph, profile, plan=plan, cost=cost, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(best_first, "memory_budget", recorded)
        if every_held:
            patch.setattr(stage_floor, "least_floor", lambda search, item, twin: -math.inf)
        if not own_stages:
            patch.setattr(StageFloors, "floor_bytes", lambda self, plan: 0.0)
        search = Search(GRAPH, PROFILE, OPTIONS)
        return search, search.run(), budgets


@pytest.fixture(scope="module")
def runs():
    with pytest.MonkeyPatch.context() as monkeypatch:
        return _run(monkeypatch, every_held=False), _run(monkeypatch, every_held=True)


@pytest.fixture(scope="module")
def held_floor_alone():
    with pytest.MonkeyPatch.context() as monkeypatch:
        return _run(monkeypatch, every_held=False, own_stages=False)


def _priced(result) -> dict:
    return {c.plan.describe(): c for c in result.candidates if c.cost is not None}


def test_the_retries_start_from_the_same_plans_and_every_fitting_plan_is_priced_alike(runs):
    (_, ordered, budgets), (_, every, every_budgets) = runs
    assert budgets and budgets == every_budgets  # the same most frugal plan and peak, retry by retry
    assert ordered.best.describe() == every.best.describe()
    assert ordered.best_cost.step_time_s == every.best_cost.step_time_s
    timed = [(c.plan.describe(), c.objective, c.reason) for c in every.candidates if c.objective is not None]
    assert [(c.plan.describe(), c.objective, c.reason) for c in ordered.candidates if c.objective is not None] == timed
    priced, every_priced = _priced(ordered), _priced(every)
    assert priced.keys() < every_priced.keys()  # fewer plans priced, each as before
    assert all(c.cost.peak_memory_bytes == every_priced[key].cost.peak_memory_bytes for key, c in priced.items())


def test_a_plan_left_unpriced_keeps_a_row_with_its_floor_below_its_peak(runs):
    (search, ordered, _), (_, every, _) = runs
    rows = {}  # a config's pruned rows (a retry's tp_plan shares its first's configs)
    for c in ordered.candidates:
        rows.setdefault(tuple(c.config.items()), []).append(c.reason if c.status == "pruned" else "")
    unpriced = [c for key, c in _priced(every).items() if key not in _priced(ordered)]
    assert unpriced
    for c in unpriced:
        floor, why = search.held_floor_bytes(c.plan)
        assert f"pruned (memory): {why} need {floor / 2**30:.1f} GiB" in "|".join(rows[tuple(c.config.items())])
        assert search._usable_bytes < floor <= c.cost.peak_memory_bytes
    assert any(SENT in c.reason for c in ordered.candidates)  # the sends floor holds plans back too


def test_the_floor_on_its_own_stages_is_below_every_peak_and_prices_fewer(runs, held_floor_alone):
    """Every plan the exhaustive order prices (each schedule, V ones too) peaks at or above its floor on its own
    stages; ordered by it too, fewer held plans are priced than by the held floor alone, from the same retries."""
    (search, ordered, budgets), (every_search, every, _) = runs
    schedules = set()
    for c in every.candidates:
        if c.cost is not None:
            assert every_search.stage_floors.floor_bytes(c.plan) <= c.cost.peak_memory_bytes * (1 + 1e-9), c.plan
            schedules.add(c.plan.schedule)
    assert {"1f1b", "zbv", "interleaved_1f1b"} <= schedules
    _, alone, alone_budgets = held_floor_alone
    assert budgets == alone_budgets and ordered.best.describe() == alone.best.describe()
    assert _priced(ordered).keys() < _priced(alone).keys()


def test_the_floors_are_read_lazily_in_the_order_of_reading_them_all(monkeypatch):
    """stage_floor.floor_order yields each held plan's floor in the order of sorting them all, having read a plan's
    floor on its own stages only once no plan of a lesser held floor is left: the first reads fewer."""
    helds, real = [], best_first.Pass._price_held

    def captured(self, state):
        helds.append((self.search, list(state.held)))
        return real(self, state)

    monkeypatch.setattr(best_first.Pass, "_price_held", captured)
    Search(GRAPH, PROFILE, OPTIONS).run()
    assert helds
    fewer = False
    for search, held in helds:
        every = [
            (stage_floor.least_floor(search, it, stage_floor.held_floor(search, it)[1]), i) for i, it in enumerate(held)
        ]
        assert list(stage_floor.floor_order(search, held)) == sorted(every)
        reads, floors = [], search.stage_floors
        read = lambda plan: reads.append(plan) or StageFloors.floor_bytes(floors, plan)  # noqa: E731
        monkeypatch.setattr(floors, "floor_bytes", read)
        next(stage_floor.floor_order(search, held))
        fewer |= len(reads) < len(held)
    assert fewer
