"""The search's floor on the V schedules' bubble (StageCosts.bubble_floor, cost/pp/schedule.py bubble_floor): below the
bubble CostModel prices for every V plan, and with it the pruned search prices fewer V plans and still keeps the
exhaustive best plan and its price."""

from __future__ import annotations

from dataclasses import replace

import pytest
from synthetic import synthetic_gpt, synthetic_host, synthetic_profile

from autoplan.solve.activation_offload import may_offload, may_offload_a_twin
from autoplan.solve.candidates import SearchOptions
from autoplan.solve.pins import parse_fixes
from autoplan.solve.search import Search
from autoplan.solve.stage_costs import StageCosts
from autoplan.types import Plan
from autoplan.types.schedules import V_SCHEDULES

GRAPH = synthetic_gpt(layers=8, hidden=1024, heads=16, vocab=32000, seq=1024, batch=32)
PROFILE = synthetic_profile(memory_bytes=24 * 2**30)
OPTIONS = SearchOptions(devices=8, batch_size=32, fixes=parse_fixes("pp=4"), keep=3)


@pytest.fixture(scope="module")
def exhaustive():
    everything = Search(GRAPH, PROFILE, OPTIONS)
    everything._beaten = lambda bound: False  # price every candidate
    everything._usable_bytes = float("inf")  # whatever its memory floor
    everything.memory_first = False  # and the time of every plan that does not fit
    return everything, everything.run()


def _priced_v(result) -> int:
    return sum(c.config["schedule"] in V_SCHEDULES for c in result.candidates if c.cost)


def test_the_v_floor_is_below_every_priced_v_bubble(exhaustive):
    search, full = exhaustive
    priced = [c for c in full.candidates if c.cost is not None and c.plan.schedule in V_SCHEDULES]
    assert {c.plan.schedule for c in priced} == set(V_SCHEDULES) and {c.plan.recompute for c in priced} > {"none"}
    for c in priced:
        floor = search.stage_costs.bubble_floor(c.plan, may_offload=False)
        times, _ = search.stage_costs.stage_totals(c.plan, c.plan.stages)
        assert 0 < floor * max(times) <= c.cost.bubble_s * (1 + 1e-9)
        assert search.stage_costs.bubble_floor(c.plan) == 0  # a plan that may offload: the copies are not forward


def _without_incumbent() -> Search:
    """A search that meets its groups in bound order from an empty threshold, as the V floor was measured."""
    search = Search(GRAPH, PROFILE, OPTIONS)
    search.best_first = False  # solve/best_first.py would prune them all before the V floor is asked
    return search


def test_the_pruned_search_prices_fewer_v_plans_and_keeps_the_exhaustive_best(exhaustive, monkeypatch):
    assert Search(GRAPH, PROFILE, OPTIONS).run().best_cost.step_time_s == exhaustive[1].best_cost.step_time_s
    pruned = _without_incumbent().run()
    _, full = exhaustive
    assert pruned.best.describe() == full.best.describe()
    assert pruned.best_cost.step_time_s == full.best_cost.step_time_s
    assert [c.objective for c in pruned.ranked()[:3]] == [c.objective for c in full.ranked()[:3]]
    floor = StageCosts.bubble_floor
    monkeypatch.setattr(StageCosts, "bubble_floor", lambda self, plan, may_offload=True: floor(self, plan))
    unfloored = _without_incumbent().run()  # the V floor at 0, as when it was not known
    assert 0 < _priced_v(pruned) < _priced_v(unfloored) < _priced_v(full)


def test_a_group_whose_budgeted_twins_may_offload_gets_no_v_floor():
    """A plan recomputing every block cannot offload, but its budgeted twin (fewer blocks recomputed) can: the
    search asks may_offload_a_twin: true at tp = cp = ep = 1 with a host; false at tp = 2, hostless or pinned off."""
    host = replace(PROFILE, host=synthetic_host())
    plan = Plan(devices=4, dp=1, tp=1, pp=4, micro_batch_size=1, num_microbatches=8, schedule="zbv",
                virtual_stages=2, recompute="full")  # fmt: skip
    assert not may_offload(plan, host, {}) and may_offload_a_twin(plan, host, {})
    assert not may_offload_a_twin(plan, host, {"offload_activations": False})
    assert not may_offload_a_twin(plan, PROFILE, {})
    split = Plan(devices=8, dp=1, tp=2, pp=4, micro_batch_size=1, num_microbatches=8, schedule="zbv",
                 virtual_stages=2, recompute="full")  # fmt: skip
    assert not may_offload_a_twin(split, host, {})
