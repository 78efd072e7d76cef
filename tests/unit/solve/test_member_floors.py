"""What best_first.py's member loop reads once and hands on: a member's states floor, its option's
(solve/member_bounds.py states_floor_bytes), given to schedule_steps.floors_fit and next_fitting (``Pass._consider``),
which then answer as they do computing it, and refuse a member whose states exceed the device before any probe; and
the held plans' floors on their own stages (solve/stage_floor.py), whose per-device sums the ZeRO and sync variants
of one partition share."""

from __future__ import annotations

from functools import cache

import pytest
from synthetic import synthetic_gpt, synthetic_profile
from synthetic.exhaustive import priced_everything

from autoplan.errors import PlanError
from autoplan.solve import schedule_steps, stage_floor
from autoplan.solve.candidates import SearchOptions
from autoplan.solve.pins import parse_fixes
from autoplan.solve.schedule_steps import floors_fit, larger_steps, next_fitting, with_steps
from autoplan.solve.search import Search
from autoplan.solve.stage_floor import StageFloors
from autoplan.types.plan import Plan
from autoplan.types.schedule_steps import check_schedule_steps
from autoplan.types.schedules import check_schedule

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
    plans = [c.plan for c in every.candidates if c.plan is not None and larger_steps(c.plan)][::16]
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


def _variant(plan: Plan, **fields) -> Plan:
    """``plan`` with ``fields``, its stages list the same object (as a stage option's ZeRO and sync variants)."""
    variant = Plan.__new__(Plan)
    variant.__dict__.update(plan.__dict__)
    variant.__dict__.update(fields)
    return variant


def test_the_floor_on_its_stages_sums_a_partition_once_for_its_variants(monkeypatch):
    """Variants in what the per-device sums do not read (ZeRO stage, gradient sync, offload, k) share them, and
    each floor is a fresh StageFloors'; another partition, or an equal one in another list, is summed again."""
    search, plans = _searched()
    plan = next(p for p in plans if p.virtual_stages == 1 and len(p.stages[0]) > 1)
    variants = [_variant(plan, zero_stage=z) for z in (0, 1, 2, 3)]
    variants += [_variant(plan, grad_reduce_dtype="bf16", offload="optimizer"), with_steps(plan, larger_steps(plan)[0])]
    moved = [plan.stages[0][:-1], [plan.stages[0][-1], *plan.stages[1]], *plan.stages[2:]]
    others = [_variant(plan, stages=moved), _variant(plan, stages=[list(chunk) for chunk in plan.stages])]
    summed, real = [], stage_floor.plan_chunk_stages
    monkeypatch.setattr(stage_floor, "plan_chunk_stages", lambda *a: summed.append(a) or real(*a))
    floors, fresh = StageFloors(search), []
    for p in variants + others:
        fresh.append(StageFloors(search).floor_bytes(p))
        assert floors.floor_bytes(p) == fresh[-1] > 0, p.describe()
    assert len(set(fresh)) > 2  # the variants' floors differ, not their sums
    assert len(summed) == len(fresh) + 1 + len(others)  # each fresh one's; the variants' once, each other's


def test_larger_steps_probe_only_the_divisors_and_find_what_probing_every_k_finds(monkeypatch):
    """schedule_steps._larger_steps builds a probe Plan only for a k that divides m: every other k > 1
    check_schedule_steps refuses, so the k found are those of probing every k (the checks themselves, here)."""
    probed, real, found_any = [], schedule_steps.check_schedule_steps, False
    monkeypatch.setattr(schedule_steps, "check_schedule_steps", lambda plan: probed.append(plan) or real(plan))
    for schedule, v in (("1f1b", 1), ("interleaved_1f1b", 2), ("interleaved_zb", 1), ("dualpipev", 2)):
        for m, k, pp in ((30, 1, 4), (48, 2, 8), (64, 1, 4), (7, 1, 2), (12, 12, 4), (12, 1, 1)):
            for runtime in ("autoplan", "megatron"):
                probed.clear()
                found = schedule_steps._larger_steps.__wrapped__(m, k, pp, v, schedule, runtime)
                every = [j for j in range(k + 1, m + 1) if pp > 1 and _runs(m, j, pp, v, schedule, runtime)]
                assert list(found) == every, (schedule, m, k, pp, runtime)
                found_any |= bool(found)
                assert len(probed) == sum(1 for j in range(k + 1, m + 1) if pp > 1 and m % j == 0)
    assert found_any


def _runs(m: int, j: int, pp: int, v: int, schedule: str, runtime: str) -> bool:
    """Whether a Plan of ``j`` schedule steps passes the two checks that read it."""
    plan = Plan.unchecked(devices=pp, dp=1, tp=1, pp=pp, micro_batch_size=1, num_microbatches=m, schedule=schedule,
                          virtual_stages=v, runtime=runtime, schedule_steps=j)  # fmt: skip
    try:
        check_schedule_steps(plan)
        check_schedule(plan)
    except PlanError:
        return False
    return True
