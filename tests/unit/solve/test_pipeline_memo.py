"""The search's partition memos (solve/partitions.py) never hand a plan another plan's stages: every plan's memoised
stages equal those of a fresh Partitions asked for that plan alone (a V and a looping schedule with the same chunk
count and degrees once shared them); and each distinct problem is solved once."""

from __future__ import annotations

import pytest
from synthetic import synthetic_gpt, synthetic_profile

import autoplan.solve.partitions as partitions
from autoplan.solve.candidates import SearchOptions
from autoplan.solve.partitions import Partitions
from autoplan.solve.pins import parse_fixes
from autoplan.solve.search import Search
from autoplan.solve.stage_costs import StageCosts
from autoplan.types.schedules import V_SCHEDULES


@pytest.fixture(scope="module")
def search():
    graph = synthetic_gpt(layers=8, hidden=512, heads=8, vocab=32000, seq=256, batch=16)
    options = SearchOptions(devices=4, batch_size=16, fixes=parse_fixes("pp=2"))
    return Search(graph, synthetic_profile(), options)


def _plans(search):
    """Every plan of every group (a tp plan each), each stage option and ZeRO choice, before stages are set."""
    names = dict(model=search.graph.model_name, profile=search.profile.name)
    for _, g in search.groups():
        tp_plan = search._choose(g).tp_plan
        for zero, grads in search._dp_choices(g.degrees):
            for overlap, recompute, (schedule, v, steps) in search._stage_options(g):
                kw = dict(recompute=recompute, schedule=schedule, v=v, steps=steps, zero=zero, grads=grads, **names)
                yield g.plan(tp_plan=tp_plan, tp_overlap=overlap, **kw)


def test_memoised_stages_are_each_plans_own(search, monkeypatch):
    solved = []
    solve = partitions.partition
    monkeypatch.setattr(partitions, "partition", lambda problem, **kw: solved.append(problem) or solve(problem, **kw))
    plans = list(_plans(search))
    assert {p.schedule for p in plans} >= {"interleaved_1f1b", *V_SCHEDULES}
    shared = Partitions(search.graph, search.stage_costs, solver="highs")
    memoised = [shared.stages(p) for p in plans]
    misses = len(solved)
    keys = [problem.content_key() for problem in solved]
    assert len(keys) == len(set(keys))  # each distinct problem solved once
    for plan, stages in zip(plans, memoised):
        assert stages == Partitions(search.graph, search.stage_costs, solver="highs").stages(plan), plan.describe()
    assert len(solved) - misses == len(plans)  # a fresh Partitions solves each plan's problem
    assert misses < len({(p.describe(), p.schedule) for p in plans})


def test_memoised_problems_are_each_plans_own(search):
    """StageCosts.problem's per-block memo (keyed on the blocks' context, recompute, overlap and bytes per
    parameter) hands each plan, with and without the memory limit, the problem a fresh StageCosts builds for it
    alone: same content, bit for bit, and so the same partition."""
    plans = list(_plans(search))
    assert len({p.zero_stage for p in plans}) > 1 and len({p.recompute for p in plans}) > 1
    shared = StageCosts(search.graph, search.profile, search.stage_costs.cost_model)
    for plan in plans:
        for limit in (True, False):
            fresh = StageCosts(search.graph, search.profile, search.stage_costs.cost_model)
            assert (
                shared.problem(plan, memory_limit=limit).content_key()
                == fresh.problem(plan, memory_limit=limit).content_key()
            ), plan.describe()
