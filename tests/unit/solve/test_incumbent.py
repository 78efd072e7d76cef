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


def _run(*, incumbent: bool, keep: int, exhaustive: bool = False):
    search = Search(GRAPH, PROFILE, SearchOptions(devices=8, batch_size=8, keep=keep))
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
