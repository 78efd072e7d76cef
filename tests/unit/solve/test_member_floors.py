"""What best_first.py's member loop reads once and hands on (solve/best_first.py ``Pass._consider``): a member's states
floor, its option's (solve/member_bounds.py states_floor_bytes), given to schedule_steps.floors_fit and next_fitting,
which then answer as they do computing it, and refuse a member whose states exceed the device before any probe."""

from __future__ import annotations

from functools import cache

import pytest
from synthetic import synthetic_gpt, synthetic_profile
from synthetic.exhaustive import priced_everything

from autoplan.solve.candidates import SearchOptions
from autoplan.solve.pins import parse_fixes
from autoplan.solve.schedule_steps import floors_fit, larger_steps, next_fitting
from autoplan.solve.search import Search

#: long sequences, narrow blocks, 32 micro-batches: the sends weigh, so some k fit and others do not
GRAPH = synthetic_gpt(layers=8, hidden=128, heads=4, vocab=512, seq=1024, batch=32)
PINS = "pp=4,mbs=1,tp=1,recompute=none"


@cache
def _searched() -> tuple[Search, list]:
    """A search, and the pipelined plans with a larger k to step to of one that priced every plan: on 20 MiB, some
    fit at their own k, some at a larger one, some at none."""
    options = SearchOptions(devices=8, batch_size=32, fixes=parse_fixes(PINS))
    profile = synthetic_profile(memory_bytes=int(0.02 * 2**30))
    every = priced_everything(Search(GRAPH, profile, options)).run()
    plans = [c.plan for c in every.candidates if c.plan is not None and larger_steps(c.plan)][::8]
    return Search(GRAPH, profile, options), plans


def _described(plan):
    return None if plan is None else (plan.describe(), plan.schedule_steps)


def test_the_floors_given_a_states_floor_answer_as_they_do_computing_it():
    search, plans = _searched()
    fitting = [next_fitting(search, plan) for plan in plans]
    assert len(plans) > 20 and {p is None for p in fitting} == {True, False}  # some step on, some cannot
    assert {floors_fit(search, plan) for plan in plans} == {True, False}
    for plan, found in zip(plans, fitting):
        states = search.bounds.states_floor_bytes(plan)
        assert _described(next_fitting(search, plan, states_bytes=states)) == _described(found), plan.describe()
        assert floors_fit(search, plan, states_bytes=states) == floors_fit(search, plan), plan.describe()


def test_a_states_floor_over_the_device_refuses_before_any_floor_is_read(monkeypatch):
    search, plans = _searched()

    def unread(*args, **kwargs):
        raise AssertionError("a floor was read")

    monkeypatch.setattr(search.bounds, "states_floor_bytes", unread)
    monkeypatch.setattr(search.bounds, "memory_floor_bytes", unread)
    over = search._usable_bytes * 1.01
    for plan in plans:
        assert next_fitting(search, plan, states_bytes=over) is None
        assert not floors_fit(search, plan, states_bytes=over)
    with pytest.raises(AssertionError, match="a floor was read"):
        next_fitting(search, plans[0])
