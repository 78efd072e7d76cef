"""The routed experts' model states in the search's memory floors (cost/memory/experts_floor.py): on a small MoE's
space every floor (states, in flight, sends) stays at or below the peak CostModel prices for every plan an exhaustive
search prices, over expert placements, ZeRO stages and schedules, and the experts' states raise it."""

from __future__ import annotations

import pytest
from synthetic import synthetic_profile
from synthetic.exhaustive import priced_everything
from synthetic.moe import MIXTRAL_BATCH, mixtral_graph

from autoplan.cost.memory.experts_floor import ExpertsFloor
from autoplan.solve.candidates import SearchOptions
from autoplan.solve.pins import parse_fixes
from autoplan.solve.search import Search


@pytest.fixture(scope="module")
def exhaustive():
    pytest.importorskip("transformers")
    options = SearchOptions(devices=8, batch_size=MIXTRAL_BATCH, fixes=parse_fixes("tp=1,mbs=4"))
    search = priced_everything(Search(mixtral_graph(), synthetic_profile(), options))
    return search, search.run()


def test_no_memory_floor_with_the_experts_states_exceeds_a_priced_moe_peak(exhaustive):
    search, result = exhaustive
    priced = [c for c in result.candidates if c.cost is not None]
    assert {c.plan.ep for c in priced} >= {1, 2, 8} and {c.plan.pp for c in priced} >= {1, 2}
    assert {c.plan.zero_stage for c in priced} >= {0, 1, 3}
    bounds = search.bounds
    for c in priced:
        plan = c.plan
        assert bounds.experts.states_bytes(plan) > 0  # every plan holds routed experts
        floors = (bounds.states_floor_bytes(plan), bounds.memory_floor_bytes(plan), bounds.sends.floor_bytes(plan))
        floors += (search.stage_floors.floor_bytes(plan),)  # on its own stages (solve/stage_floor.py)
        assert max(floors) <= c.cost.peak_memory_bytes * (1 + 1e-12), plan.describe()


def test_plans_the_experts_states_overflow_are_held_back_and_the_best_is_kept(monkeypatch):
    """On a device the experts fill (0.05 GiB: the exhaustive peaks above span 0.04-0.14 GiB), the floors with the
    experts' states set plans aside unpriced that they priced without, and the best plan and price stay."""
    pytest.importorskip("transformers")
    profile = synthetic_profile(memory_bytes=int(0.05 * 2**30))
    options = SearchOptions(devices=8, batch_size=MIXTRAL_BATCH, fixes=parse_fixes("tp=1,mbs=4"))
    floored = Search(mixtral_graph(), profile, options).run()
    monkeypatch.setattr(ExpertsFloor, "states_bytes", lambda self, plan: 0.0)
    without = Search(mixtral_graph(), profile, options).run()

    def priced(result) -> int:
        return sum(c.cost is not None for c in result.candidates)

    assert priced(floored) < priced(without)
    assert any(c.reason.startswith("pruned (memory)") for c in floored.candidates)
    assert floored.best.describe() == without.best.describe()
    assert floored.best_cost.step_time_s == without.best_cost.step_time_s
