"""A V schedule's activations in flight in the search's memory floor (cost/memory/in_flight_floor.py: each device's
counts from its replayed order, ``held_floor``, as for the other replayed schedules): the floor stays at or below
the peak CostModel prices for every V plan of exhaustive dense and MoE searches, it rises above the states and
sends floors that were a V plan's only floors before, and the search sets V plans aside unpriced with the same
best plan, price and ranked rows (docs/ilp.md, "Memory floor")."""

from __future__ import annotations

import pytest
from synthetic import synthetic_gpt, synthetic_profile
from synthetic.exhaustive import priced_everything
from synthetic.moe import MIXTRAL_BATCH, mixtral_graph

from autoplan.cost import bounds as bounds_module
from autoplan.solve import schedule_steps
from autoplan.solve.candidates import SearchOptions
from autoplan.solve.pins import parse_fixes
from autoplan.solve.search import Search
from autoplan.types.schedules import V_SCHEDULES

#: eight blocks of long sequences and a small vocabulary: activations, not the logits, fill the device
GRAPH = synthetic_gpt(layers=8, hidden=256, heads=8, vocab=512, seq=512, batch=16)
DENSE = SearchOptions(devices=4, batch_size=16, fixes=parse_fixes("pp=2,mbs=2"))
MOE = SearchOptions(devices=8, batch_size=MIXTRAL_BATCH, fixes=parse_fixes("tp=1,pp=2,mbs=2"))
TP1 = SearchOptions(devices=4, batch_size=16, fixes=parse_fixes("tp=1,pp=2,mbs=2"))


def _v_floors(search: Search, result) -> list[tuple[float, float, float]]:
    """(in-flight floor, states and sends floors, priced peak) of every V plan ``result`` priced."""
    bounds, rows = search.bounds, []
    for c in (c for c in result.candidates if c.cost is not None and c.plan.schedule in V_SCHEDULES):
        others = max(bounds.states_floor_bytes(c.plan), bounds.sends.floor_bytes(c.plan))
        rows.append((bounds.memory_floor_bytes(c.plan), others, c.cost.peak_memory_bytes))
    return rows


@pytest.mark.parametrize("case", ["dense", "moe"])
def test_a_v_plan_s_in_flight_floor_holds_below_every_priced_peak_and_above_its_other_floors(case):
    if case == "moe":
        pytest.importorskip("transformers")
    graph, options = (GRAPH, DENSE) if case == "dense" else (mixtral_graph(), MOE)
    search = priced_everything(Search(graph, synthetic_profile(), options))
    rows = _v_floors(search, search.run())
    assert len(rows) >= 8
    assert all(floor <= peak * (1 + 1e-12) for floor, _, peak in rows)
    assert sum(floor > others for floor, others, _ in rows) >= len(rows) // 8  # none before: V had no floor here


def _no_v_weights(monkeypatch) -> None:
    """The floor as it was: no activations in flight for a V schedule."""
    weights = bounds_module.schedule_weights
    monkeypatch.setattr(
        bounds_module, "schedule_weights", lambda plan: None if plan.schedule in V_SCHEDULES else weights(plan)
    )


def test_v_plans_are_set_aside_unpriced_and_the_best_and_ranked_rows_stay(monkeypatch):
    """At tp = 1 (no TP retry prices held plans) on a device the fastest plans overflow: V plans held at their
    entry schedule step, the best a larger step's (solve/schedule_steps.py)."""
    profile = synthetic_profile(memory_bytes=int(0.08 * 2**30))
    floored = Search(GRAPH, profile, TP1).run()
    _no_v_weights(monkeypatch)
    without = Search(GRAPH, profile, TP1).run()

    def v_priced(result) -> int:
        return sum(c.cost is not None and c.plan.schedule in V_SCHEDULES for c in result.candidates)

    def ranked(result) -> list:
        return [(c.config, c.objective, c.cost.step_time_s) for c in result.candidates if c.feasible]

    held = [c for c in floored.candidates if "activations in flight" in (c.reason or "")]
    assert any(c.config["schedule"] in V_SCHEDULES for c in held)
    assert v_priced(floored) < v_priced(without)
    assert floored.best.describe() == without.best.describe()
    assert floored.best_cost.step_time_s == without.best_cost.step_time_s
    assert ranked(floored) == ranked(without)


def test_the_schedule_steps_chain_steps_v_plans_past_their_in_flight_floor(monkeypatch):
    """The chain (schedule_steps.next_fitting) reads a V plan's in-flight floor at every larger schedule step, as at
    its entry step: it steps past the k that floor rules out (recorded short for the recompute budgets, as where it
    is priced: tests/unit/solve/test_budget_short_rule.py), where without the floor it stopped at some of them."""
    options = SearchOptions(devices=4, batch_size=16, fixes=parse_fixes("tp=1,pp=2,mbs=1"))
    search = priced_everything(Search(GRAPH, synthetic_profile(), options))
    members = [c.plan for c in search.run().candidates if c.cost is not None and c.plan.schedule in V_SCHEDULES]
    members = [plan for plan in members if schedule_steps.larger_steps(plan)]
    profile = synthetic_profile(memory_bytes=int(0.06 * 2**30))
    floored = Search(GRAPH, profile, options)
    stepped = [schedule_steps.next_fitting(floored, plan) for plan in members]
    usable = floored._usable_bytes
    assert not any(plan is not None and floored.bounds.memory_floor_bytes(plan) > usable for plan in stepped)
    _no_v_weights(monkeypatch)
    before = Search(GRAPH, profile, options)
    unfloored = [schedule_steps.next_fitting(before, plan) for plan in members]
    monkeypatch.undo()
    fresh = Search(GRAPH, profile, options)
    assert any(plan is not None and fresh.bounds.memory_floor_bytes(plan) > usable for plan in unfloored)
