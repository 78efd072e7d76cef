"""The early incumbent (solve/incumbent.py): the search prices the members of least bound (2) of its first groups
before its bounded loop, prices fewer plans, and keeps the best plan, its price and the exact top k of pricing every
configuration."""

from __future__ import annotations

import pytest
from synthetic import synthetic_gpt, synthetic_profile

from autoplan.solve.candidates import SearchOptions
from autoplan.solve.search import Search

GRAPH = synthetic_gpt(layers=4, hidden=512, heads=8, vocab=8000, seq=256, batch=8)
PROFILE = synthetic_profile()
#: tests/unit/solve/test_plans_golden.py's space: its best group is not among the first by bound (1)
WIDE = dict(graph=synthetic_gpt(layers=8, hidden=1024, heads=16, vocab=32000, seq=1024, batch=32), devices=16)


def _run(*, incumbent: bool, keep: int, exhaustive: bool = False, graph=GRAPH, devices: int = 8, profile=PROFILE):
    options = SearchOptions(devices=devices, batch_size=graph.batch_size, keep=keep)
    search = Search(graph, profile, options)
    search.early_incumbent = incumbent
    if exhaustive:
        search._beaten = lambda bound: False  # price every candidate
        search._usable_bytes = float("inf")  # whatever its memory floor
        search.memory_first = False  # and the time of every plan that does not fit
    return search.run()


def _timed(result) -> int:
    return sum(c.objective is not None for c in result.candidates)


@pytest.mark.parametrize("keep", [1, 3])
def test_the_early_incumbent_prices_fewer_plans_and_keeps_the_exhaustive_top(keep):
    early, plain = _run(incumbent=True, keep=keep), _run(incumbent=False, keep=keep)
    full = _run(incumbent=False, keep=keep, exhaustive=True)
    assert 0 < _timed(early) < _timed(plain) < _timed(full)
    for result in (early, plain):
        assert result.best.describe() == full.best.describe()
        assert result.best_cost.step_time_s == full.best_cost.step_time_s
        assert [c.objective for c in result.ranked()[:keep]] == [c.objective for c in full.ranked()[:keep]]


def test_every_probe_is_a_row_once():
    """A probe's rows join the candidates where the loop reaches its plan, or at the end: none twice, none lost."""
    early = _run(incumbent=True, keep=1)
    timed = [c.plan for c in early.candidates if c.objective is not None]
    assert len(timed) == len({repr(plan) for plan in timed})
    assert early.best in timed


def test_best_first_prices_no_plan_whose_bound_the_best_beats():
    """Plans are priced in order of bound across the groups, so none whose bound reaches the best objective is
    priced (memory or time), where the plain loop, group by group, prices some; the best is the exhaustive's."""
    wide = dict(WIDE, profile=synthetic_profile(memory_bytes=24 * 2**30))
    early, plain = _run(incumbent=True, keep=1, **wide), _run(incumbent=False, keep=1, **wide)
    full = _run(incumbent=False, keep=1, exhaustive=True, **wide)
    best = full.best_cost.step_time_s

    def priced(result) -> list:
        return [c for c in result.candidates if c.status == "evaluated"]

    assert not [c for c in priced(early) if c.lower_bound >= best]
    assert [c for c in priced(plain) if c.lower_bound >= best]
    assert len(priced(early)) < len(priced(plain))
    assert early.best.describe() == full.best.describe() and early.best_cost.step_time_s == best
    assert [c.objective for c in early.ranked()[:1]] == [c.objective for c in full.ranked()[:1]]


def test_a_probe_stopped_early_leaves_the_loop_exact(monkeypatch):
    """The probe's stop after stale expansions (incumbent.STALE_GROUPS) only hands the loop a higher threshold:
    stopped after the first expansion, the best plan, its price and the exact top 1 are the exhaustive run's."""
    from autoplan.solve import incumbent

    wide = dict(WIDE, profile=synthetic_profile(memory_bytes=24 * 2**30))
    full = _run(incumbent=False, keep=1, exhaustive=True, **wide)
    whole = _run(incumbent=True, keep=1, **wide)
    monkeypatch.setattr(incumbent, "STALE_GROUPS", 0)
    stopped = _run(incumbent=True, keep=1, **wide)
    priced = [len([c for c in r.candidates if c.status == "evaluated"]) for r in (stopped, whole)]
    assert priced[0] != priced[1]  # the stop changed what was priced
    assert stopped.best.describe() == full.best.describe()
    assert stopped.best_cost.step_time_s == full.best_cost.step_time_s
    assert [c.objective for c in stopped.ranked()[:1]] == [c.objective for c in full.ranked()[:1]]
