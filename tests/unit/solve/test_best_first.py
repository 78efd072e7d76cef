"""The one best-first pass (solve/best_first.py): the search takes groups and members best first across the space,
expands each group once, prices fewer plans than the plain branch and bound, and keeps the best plan, its price and
the exact top k of pricing every configuration."""

from __future__ import annotations

from collections import Counter
from functools import cache

import pytest
from synthetic import synthetic_gpt, synthetic_profile

from autoplan.solve import best_first
from autoplan.solve.candidates import SearchOptions
from autoplan.solve.search import Search

GRAPH = synthetic_gpt(layers=4, hidden=512, heads=8, vocab=8000, seq=256, batch=8)
PROFILE = synthetic_profile()
#: a space whose best group is not the first by bound (1), and whose plain order prices plans whose bound the best
#: beats (both asserted); its exhaustive run prices 15,936 plans (at 16 devices and batch 16, 50,814: 3x the time)
WIDE = dict(
    graph=synthetic_gpt(layers=8, hidden=1024, heads=16, vocab=32000, seq=1024, batch=8),
    devices=8,
    profile=synthetic_profile(memory_bytes=24 * 2**30),
)

BLANK = dict(recompute="none", schedule="1f1b", v=1, zero=0, tp_plan={}, model="", profile="")


def _run(*, best: bool, keep: int, exhaustive: bool = False, graph=GRAPH, devices: int = 8, profile=PROFILE):
    """``best``: best first (else groups in bound (1) order, each priced as it is expanded)."""
    options = SearchOptions(devices=devices, batch_size=graph.batch_size, keep=keep)
    search = Search(graph, profile, options)
    search.best_first = best
    if exhaustive:
        search._beaten = lambda bound: False  # price every candidate
        search._usable_bytes = float("inf")  # whatever its memory floor
        search.memory_first = False  # and the time of every plan that does not fit
    return search.run()


@cache
def _full():
    """The exhaustive run of GRAPH's space on 8 devices, shared by both ``keep`` (as :func:`_full_wide`)."""
    return _run(best=False, keep=3, exhaustive=True)


@cache
def _full_wide():
    """The exhaustive run of WIDE (on a 24 GiB device), shared by the tests that compare with it
    (``keep`` does not change what an exhaustive run prices; 3: the top 3 are exact)."""
    return _run(best=False, keep=3, exhaustive=True, **WIDE)


@cache
def _wide_best_first(keep: int) -> tuple:
    """The best-first run of WIDE and the (group, tp_plan) it expanded, in order, shared by the tests that read it."""
    expanded = []
    expand = best_first.Pass._expand

    def counted(self, state):
        expanded.append((state.group, tuple(sorted(state.choice.tp_plan.items()))))
        return expand(self, state)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(best_first.Pass, "_expand", counted)
        return _run(best=True, keep=keep, **WIDE), expanded


def _everything_wide(keep: int) -> list:
    """Every group of WIDE's space with its bound (1), best first."""
    graph = WIDE["graph"]
    options = SearchOptions(devices=WIDE["devices"], batch_size=graph.batch_size, keep=keep)
    return Search(graph, WIDE["profile"], options).groups()


def _timed(result) -> int:
    return sum(c.objective is not None for c in result.candidates)


@pytest.mark.parametrize("keep", [1, 3])
def test_best_first_prices_fewer_plans_than_the_plain_order_and_keeps_the_exhaustive_top(keep):
    early, plain = _run(best=True, keep=keep), _run(best=False, keep=keep)
    full = _full()
    assert 0 < _timed(early) < _timed(plain) < _timed(full)
    for result in (early, plain):
        assert result.best.describe() == full.best.describe()
        assert result.best_cost.step_time_s == full.best_cost.step_time_s
        assert [c.objective for c in result.ranked()[:keep]] == [c.objective for c in full.ranked()[:keep]]


def test_every_priced_plan_is_a_row_once():
    """Each member is priced once, where the pass takes it: no plan timed twice, the best among them."""
    early = _run(best=True, keep=1)
    timed = [c.plan for c in early.candidates if c.objective is not None]
    assert len(timed) == len({repr(plan) for plan in timed})
    assert early.best in timed


def test_best_first_prices_no_plan_whose_bound_the_best_beats():
    """Plans are priced in order of bound across the groups, so none whose bound reaches the best objective is
    priced (memory or time), where the plain loop, group by group, prices some; the best is the exhaustive's."""
    early, plain = _wide_best_first(1)[0], _run(best=False, keep=1, **WIDE)
    full = _full_wide()
    best = full.best_cost.step_time_s
    first = _everything_wide(1)[0][1].plan(**BLANK)
    assert _shape(full.best) != _shape(first)  # WIDE's property: its best group is not the first by bound (1)

    def priced(result) -> list:
        return [c for c in result.candidates if c.status == "evaluated"]

    assert not [c for c in priced(early) if c.lower_bound >= best]
    assert [c for c in priced(plain) if c.lower_bound >= best]
    assert len(priced(early)) < len(priced(plain))
    assert early.best.describe() == full.best.describe() and early.best_cost.step_time_s == best
    assert [c.objective for c in early.ranked()[:1]] == [c.objective for c in full.ranked()[:1]]


def _shape(plan) -> tuple:
    return (plan.dp, plan.tp, plan.pp, plan.micro_batch_size, plan.precision, plan.sequence_parallel)


@pytest.mark.parametrize("keep", [1, 3])
def test_each_group_is_expanded_once_and_the_top_is_the_exhaustive_one(keep):
    """Every (group, tp_plan) is expanded (its members partitioned and bounded) at most once, and each plan priced at
    most once, on WIDE (a group may come twice only with a second tp_plan: the memory-budgeted
    retry's, where nothing of its first fits); some groups never (pruned whole). Nothing is priced outside an
    expansion. Best plan, price and exact top k: the exhaustive run's."""
    result, expanded = _wide_best_first(keep)
    groups = Counter(group for group, _ in expanded)
    assert expanded and len(expanded) == len(set(expanded)) and max(groups.values()) <= 2
    everything = _everything_wide(keep)
    assert len(groups) < len(everything)
    priced = [c.plan for c in result.candidates if c.status == "evaluated"]
    assert len(priced) == len({repr(plan) for plan in priced})
    assert {_shape(plan) for plan in priced} <= {_shape(g.plan(**BLANK)) for g in groups}  # none outside an expansion
    full = _full_wide()
    assert result.best.describe() == full.best.describe()
    assert result.best_cost.step_time_s == full.best_cost.step_time_s
    assert [c.objective for c in result.ranked()[:keep]] == [c.objective for c in full.ranked()[:keep]]
