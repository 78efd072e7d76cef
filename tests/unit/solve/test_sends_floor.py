"""The sends floor (cost/memory/sent_floor.py): the boundary tensors torch's runtime holds to the step's end bound a
replayed pipeline plan's peak under any partition, and a torch-run 1F1B's or GPipe's receive slots theirs. It never
exceeds a priced peak, it binds where the sends outweigh the states, and the search skips the repartition of a plan it
rules out (solve/memory_first.py: a held plan priced for the memory-budgeted TP retry, solve/best_first.py) with every
row as it was without the skip."""

from __future__ import annotations

import pytest
from synthetic import synthetic_gpt, synthetic_profile
from synthetic.exhaustive import priced_everything

from autoplan.solve import memory_first
from autoplan.solve.candidates import SearchOptions
from autoplan.solve.pins import parse_fixes
from autoplan.solve.search import Search

#: long sequences, narrow blocks and many micro-batches: the tensors sent between stages weigh
GRAPH = synthetic_gpt(layers=8, hidden=128, heads=4, vocab=512, seq=1024, batch=32)
SMALL = synthetic_profile(memory_bytes=int(0.06 * 2**30))
#: at tp = 2 the plans the floors hold back are priced where nothing of their group fits (Pass._price_held)
OPTIONS = SearchOptions(devices=8, batch_size=32, fixes=parse_fixes("pp=4,tp=2"))


@pytest.fixture(scope="module", params=[4, 8], ids=["tp1", "tp2"])
def exhaustive(request):
    options = SearchOptions(devices=request.param, batch_size=32, fixes=parse_fixes("pp=4,mbs=1"))
    search = priced_everything(Search(GRAPH, SMALL, options))
    return search, search.run()


def test_the_sends_floor_never_exceeds_a_priced_peak_and_binds(exhaustive):
    search, result = exhaustive
    priced = [c for c in result.candidates if c.cost is not None]
    replayed = [c for c in priced if c.plan.schedule in ("interleaved_1f1b", "interleaved_zb", "zbv", "dualpipev")]
    assert {c.plan.schedule for c in replayed} >= {"interleaved_1f1b", "zbv"}
    binding = 0
    for c in priced:
        sends = search.bounds.sends.floor_bytes(c.plan)
        assert sends <= c.cost.peak_memory_bytes, c.plan.describe()
        binding += sends > search.bounds.memory_floor_bytes(c.plan)
    single = [c for c in priced if c.plan.schedule in ("1f1b", "gpipe")]  # their receive slots, torch-run
    assert single and all(search.bounds.sends.floor_bytes(c.plan) > 0 for c in single)
    assert any(search.bounds.sends.floor_bytes(c.plan) > search.bounds.memory_floor_bytes(c.plan) for c in single)
    if search.options.devices == 8:  # the boundary received whole on each tp rank under sequence parallelism
        assert any(c.plan.tp == 2 and c.plan.sequence_parallel for c in replayed)
    assert binding  # it knows what the states and in-flight floors do not


def _rows(result) -> list[tuple]:
    return [
        (c.status, c.reason, c.objective, c.cost.peak_memory_bytes if c.cost else None, tuple(c.config.items()))
        for c in result.candidates
    ]


def test_skipping_the_repartitions_no_partition_fits_changes_no_row(monkeypatch):
    skipped = []
    real = memory_first._no_partition_fits

    def counted(search, plan):
        skipped.append(real(search, plan))
        return skipped[-1]

    monkeypatch.setattr(memory_first, "_no_partition_fits", counted)
    with_skip = Search(GRAPH, SMALL, OPTIONS).run()
    assert any(skipped)  # some repartitions were skipped
    monkeypatch.setattr(memory_first, "_no_partition_fits", lambda search, plan: False)
    without = Search(GRAPH, SMALL, OPTIONS).run()
    assert _rows(with_skip) == _rows(without)
    assert with_skip.best.describe() == without.best.describe()


def _members(search: Search) -> list:
    """Every member plan of every group of ``search`` (no stages: the floors read none)."""
    names, plans = dict(model=GRAPH.model_name, profile=search.profile.name), []
    for _, g in search.groups():
        tp_plan = search._choose(g).tp_plan
        for overlap, recompute, (schedule, v, steps) in search._stage_options(g):
            kw = dict(recompute=recompute, schedule=schedule, v=v, steps=steps, tp_plan=tp_plan, tp_overlap=overlap)
            kw.update(names)
            plans += g.plans(search._dp_choices(g.degrees), **kw)
    return plans


def test_no_partition_fits_reads_the_states_first_and_agrees_with_the_plain_floors(monkeypatch):
    """memory_first._no_partition_fits is max(Bounds.memory_floor_bytes, the sends floor) > usable; it reads the
    states alone first (memory_floor_bytes' larger of them and the activations in flight) and the sends, and
    replays the schedule (memory_floor_bytes) only for the plans neither rules out."""
    tiny = synthetic_profile(memory_bytes=int(0.02 * 2**30))  # some plans' states or sends alone exceed it, not all
    search = Search(GRAPH, tiny, SearchOptions(devices=8, batch_size=32, fixes=parse_fixes("pp=4")))
    bounds, usable, plans = search.bounds, search._usable_bytes, _members(search)
    floors = [
        max(bounds.memory_floor_bytes(p, offload=p.offload_activations), bounds.sends.floor_bytes(p)) for p in plans
    ]
    cheap = [bounds.states_floor_bytes(p) > usable or bounds.sends.floor_bytes(p) > usable for p in plans]
    replayed, real = [], bounds.memory_floor_bytes
    monkeypatch.setattr(bounds, "memory_floor_bytes", lambda plan, **kw: replayed.append(plan) or real(plan, **kw))
    assert [memory_first._no_partition_fits(search, p) for p in plans] == [f > usable for f in floors]
    assert any(f > usable for f in floors) and not all(f > usable for f in floors)
    assert any(cheap) and not all(cheap)
    assert len(replayed) == cheap.count(False)
