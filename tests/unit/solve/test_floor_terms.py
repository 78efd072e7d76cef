"""The terms of the held memory floor beyond the blocks' kept activations (cost/memory/in_flight_floor.py,
Bounds.memory_floor_bytes): the block a backward re-makes under recompute (R), the saved activations of the nodes
before the first block and after the last (s_pre, s_post), the loss's device alone, the boundary tensors a replayed
order holds at the floor's state (C, in_flight_floor.py ``device_sent``) and the receive slots of a torch-run 1F1B or
GPipe (sent_floor.py ``slots_bytes``), and the weightings beside the harmonic one (in_flight_floor.py
``_weightings``). Each raises the floor of some plan of an exhaustive search,
the floor stays at or below every peak CostModel prices, and the search prices fewer plans with the same ranked
rows (docs/ilp.md, "Memory floor")."""

from __future__ import annotations

from functools import cache

import pytest
from synthetic import synthetic_gpt, synthetic_profile
from synthetic.exhaustive import priced_everything

from autoplan.cost import bounds as bounds_module
from autoplan.cost.memory.in_flight_floor import held_sent
from autoplan.cost.memory.sent_floor import SendsFloor
from autoplan.solve.candidates import SearchOptions
from autoplan.solve.pins import parse_fixes
from autoplan.solve.search import Search
from autoplan.solve.stage_costs import StageCosts

#: a large vocabulary over long sequences: the logits weigh beside the blocks
GRAPH = synthetic_gpt(layers=8, hidden=256, heads=8, vocab=16000, seq=512, batch=32)
OPTIONS = SearchOptions(devices=8, batch_size=32, fixes=parse_fixes("tp=1"), keep=10_000)


@cache
def _exhaustive():
    search = priced_everything(Search(GRAPH, synthetic_profile(), OPTIONS))
    plans = [c for c in search.run().candidates if c.cost is not None and c.plan.pp > 1]
    return search, plans


def _floors(monkeypatch, without: str | None) -> list[float]:
    """Each priced pipelined plan's floor, with the term ``without`` left out (a fresh search's bounds)."""
    if without in ("remade", "outside"):
        kept = StageCosts.kept_bytes_total
        drop = dict(remade=0.0) if without == "remade" else dict(pre=0.0, post=0.0)
        monkeypatch.setattr(StageCosts, "kept_bytes_total", lambda self, plan: kept(self, plan)._replace(**drop))
    if without == "slots":
        monkeypatch.setattr(SendsFloor, "slots_bytes", lambda self, plan: 0.0)
    if without in ("loss device", "sent", "weightings"):
        zeroed = {"loss device": dict(loss_held=0.0), "sent": dict(mean_sent=(0, 0), loss_sent=(0, 0))}.get(without)
        zeroed = zeroed or dict(weightings=None)
        monkeypatch.setattr(bounds_module, "held_sent", lambda plan: held_sent(plan)._replace(**zeroed))
    search = Search(GRAPH, synthetic_profile(), OPTIONS)
    floors = [search.bounds.memory_floor_bytes(c.plan) for c in _exhaustive()[1]]
    monkeypatch.undo()
    return floors


def test_the_floor_holds_below_every_priced_peak(monkeypatch):
    _, priced = _exhaustive()
    assert len(priced) >= 200
    for floor, c in zip(_floors(monkeypatch, None), priced):
        assert floor <= c.cost.peak_memory_bytes * (1 + 1e-12), c.plan.describe()


@pytest.mark.parametrize("term", ["remade", "outside", "slots", "loss device", "sent", "weightings"])
def test_each_term_raises_the_floor_of_some_plan(monkeypatch, term):
    floors, without = _floors(monkeypatch, None), _floors(monkeypatch, term)
    assert all(w <= f for w, f in zip(without, floors))
    assert sum(w < f * (1 - 1e-9) for w, f in zip(without, floors)) >= 5


def test_the_search_prices_fewer_plans_with_the_same_ranked_rows(monkeypatch):
    """On a device the fastest plans overflow; every term left out prices more (the floors as they were)."""
    profile = synthetic_profile(memory_bytes=int(0.12 * 2**30))
    options = SearchOptions(devices=8, batch_size=32, fixes=parse_fixes("tp=1"), keep=50)

    def run():
        result = Search(GRAPH, profile, options).run()
        ranked = [(c.config, c.objective) for c in result.candidates if c.feasible]
        return sum(c.cost is not None for c in result.candidates), sorted(ranked, key=lambda r: r[1])[:50]

    priced, ranked = run()
    kept = StageCosts.kept_bytes_total
    monkeypatch.setattr(StageCosts, "kept_bytes_total", lambda s, p: kept(s, p)._replace(remade=0.0, pre=0.0, post=0.0))
    monkeypatch.setattr(SendsFloor, "slots_bytes", lambda self, plan: 0.0)
    monkeypatch.setattr(bounds_module, "held_sent", lambda plan: held_sent(plan)._replace(loss_held=0.0))
    before, ranked_before = run()
    assert ranked and ranked == ranked_before
    assert priced < before
