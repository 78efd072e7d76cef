"""The search's memory floor counts the activations a schedule keeps in flight (cost/memory/in_flight_floor.py), and the
zero-bubble share floor holds with routed experts (Bounds.zero_bubble_share): both prune, and the best plan and
its price stay those of pricing every configuration (docs/cost-model.md, "Memory floor")."""

from __future__ import annotations

import pytest
from synthetic import synthetic_gpt, synthetic_profile
from synthetic.moe import MIXTRAL_BATCH, mixtral_graph

from autoplan.solve.candidates import SearchOptions
from autoplan.solve.pins import parse_fixes
from autoplan.solve.search import Search

#: eight blocks of long sequences and a small vocabulary: activations, not the logits, fill the device
GRAPH = synthetic_gpt(layers=8, hidden=256, heads=8, vocab=512, seq=512, batch=16)
SMALL = synthetic_profile(memory_bytes=int(0.15 * 2**30))  # the fastest plans do not fit, slower ones do


def _pruned_and_exhaustive(graph, profile, options: SearchOptions):
    pruned = Search(graph, profile, options).run()
    everything = Search(graph, profile, options)
    everything._beaten = lambda bound: False  # price every candidate
    everything._usable_bytes = float("inf")  # whatever its memory floor
    everything.memory_first = False  # and the time of every plan that does not fit
    return pruned, everything, everything.run()


@pytest.fixture(scope="module")
def dense():
    options = SearchOptions(devices=4, batch_size=16, fixes=parse_fixes("pp=2,mbs=4"))
    return _pruned_and_exhaustive(GRAPH, SMALL, options)


def test_plans_whose_activations_overflow_are_set_aside_and_the_best_is_the_exhaustive_one(dense):
    pruned, _, full = dense
    held = [c for c in pruned.candidates if "activations in flight" in (c.reason or "")]
    assert held and all(c.status == "pruned" and c.cost is None for c in held)
    assert {c.config["schedule"] for c in held} & {"interleaved_zb", "gpipe", "interleaved_1f1b"}
    assert any(c.cost and not c.feasible for c in full.candidates)  # memory binds the exhaustive run too
    assert pruned.best.describe() == full.best.describe()
    assert pruned.best_cost.step_time_s == full.best_cost.step_time_s


def test_the_memory_floor_never_exceeds_a_priced_peak(dense):
    """The floor, and the floor on a plan's own stages, hold for every plan the exhaustive run priced: each
    recompute, schedule, ZeRO stage, tp and partition (the memory-bounded repartitions and fitted recompute budgets
    among them)."""
    _, search, full = dense
    priced = [c for c in full.candidates if c.cost is not None]
    assert {c.plan.tp for c in priced} == {1, 2} and {c.plan.recompute for c in priced} >= {"none", "full"}
    for c in priced:
        floor = search.bounds.memory_floor_bytes(c.plan)
        assert floor <= c.cost.peak_memory_bytes, c.plan.describe()
        stages_floor = search.stage_floors.floor_bytes(c.plan)  # on its own stages (solve/stage_floor.py)
        assert stages_floor <= c.cost.peak_memory_bytes * (1 + 1e-12), c.plan.describe()


def test_zero_bubble_with_routed_experts_is_bounded_and_the_best_is_the_exhaustive_one():
    """The grouped expert GEMMs get their own (T - 2W) / T floor, so a MoE's zero-bubble plans are no longer
    bounded as if they had no bubble, and the pruned search keeps the exhaustive best."""
    pytest.importorskip("transformers")
    graph, profile = mixtral_graph(), synthetic_profile()
    options = SearchOptions(devices=4, batch_size=MIXTRAL_BATCH, fixes=parse_fixes("pp=2"))
    pruned, search, full = _pruned_and_exhaustive(graph, profile, options)
    assert search.bounds.zero_bubble_share(tp=1, precision="bf16", mbs=2) > 0
    zb = [c for c in full.candidates if c.cost is not None and c.plan.schedule == "interleaved_zb"]
    assert zb and all(0 < c.lower_bound <= c.objective * (1 + 1e-9) for c in zb)
    assert pruned.best.describe() == full.best.describe()
    assert pruned.best_cost.step_time_s == full.best_cost.step_time_s
