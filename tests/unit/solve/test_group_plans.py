"""Group.plan (solve/candidates.py) copies a template per group instead of Plan.unchecked's keywords, and
member_bounds' bound (2) takes the bubble floor of one plan per ZeRO stage: each plan must equal Plan.unchecked's
of the same fields, and varying each sync field of a ZeRO choice must leave StageCosts.bubble_floor's answer (a
fresh one, nothing memoised) where that ZeRO stage's first plan has it."""

from __future__ import annotations

from dataclasses import fields, replace

import pytest
from synthetic import synthetic_gpt, synthetic_profile
from synthetic.profiles import synthetic_host

from autoplan.solve import space
from autoplan.solve.candidates import SearchOptions
from autoplan.solve.member_bounds import _first_per_zero, _stage_totals
from autoplan.solve.search import Search
from autoplan.solve.stage_costs import StageCosts
from autoplan.types.plan import Plan

#: One other value of each GradSync field (with what it needs beside it).
VARIED = [
    dict(reduce_dtype="bf16"),
    dict(compression="powersgd", rank=4),
    dict(compression="topk", ratio=0.01),
    dict(param_gather=True),
    dict(replicate=2),
    dict(offload="optimizer"),
    dict(sync_every=16, outer_optimizer="nesterov"),
]


@pytest.fixture(scope="module")
def search():
    graph = synthetic_gpt(layers=4, hidden=256, heads=8, vocab=1000, seq=128, batch=16)
    profile = replace(synthetic_profile(), host=synthetic_host())
    return Search(graph, profile, SearchOptions(devices=8, batch_size=16, allow_lossy=True))


@pytest.fixture(scope="module")
def group(search):
    return next(g for _, g in search.groups() if g.degrees.pp > 1 and g.degrees.dp > 1)


def _choices(search, group) -> list:
    offered = search._dp_choices(group.degrees)
    assert len({zero for zero, _ in offered}) > 1 and len(offered) > 4
    return offered + [(zero, replace(space.EXACT, **change)) for zero in (0, 1, 3) for change in VARIED]


def _kw(search, group, schedule: str, v: int) -> dict:
    tp_plan = search._choose(group).tp_plan
    return dict(recompute="full", schedule=schedule, v=v, tp_plan=tp_plan, model="m", profile="p", tp_overlap=False)


def test_a_group_s_plan_is_the_plan_unchecked_makes_of_its_fields(search, group):
    """Group.plan copies one template per group; each plan must be Plan.unchecked's of the same keywords."""
    assert {f.name for f in fields(space.GradSync)} == set().union(*VARIED)  # every sync field is varied
    choices, kw = _choices(search, group), _kw(search, group, "interleaved_zb", 2)
    made = group.plans(choices, **kw)
    for (zero, grads), plan in zip(choices, made, strict=True):
        expected = Plan.unchecked(
            **group._plan_fields,
            **dict(schedule="interleaved_zb", virtual_stages=2, recompute="full", tp_comm_overlap=False),
            **dict(zero_stage=zero, grad_reduce_dtype=grads.reduce_dtype, grad_compression=grads.compression),
            **dict(powersgd_rank=grads.rank, topk_ratio=grads.ratio, overlap_param_gather=grads.param_gather),
            **dict(dp_replicate=grads.replicate, offload=grads.offload, sync_every=grads.sync_every),
            **dict(outer_optimizer=grads.outer_optimizer, tp_plan=kw["tp_plan"], model="m", profile="p"),
        )
        assert plan.__dict__ == expected.__dict__ and type(plan) is Plan
        assert plan.tp_plan is kw["tp_plan"]  # the ILP's one dict: memos key on its identity
        mutable = [name for name, value in plan.__dict__.items() if type(value) in (list, dict) and name != "tp_plan"]
        assert mutable and all(
            getattr(plan, name) is not getattr(made[0], name) for name in mutable if plan is not made[0]
        )
    stages = [["h.0", "h.1"], ["h.2"], ["h.3"], []]
    assert group.plan(zero=1, stages=stages, **kw).stages is stages


@pytest.mark.parametrize(("schedule", "v"), [("interleaved_zb", 2), ("zbv", 2), ("1f1b", 1)])
def test_a_zero_choice_s_bubble_floor_reads_its_stage_alone(search, group, schedule, v):
    choices, kw = _choices(search, group), _kw(search, group, schedule, v)
    plans = group.plans(choices, **kw)
    first = {zero: group.plan(zero=zero, grads=grads, **kw) for zero, grads in _first_per_zero(choices)}
    assert set(first) == {p.zero_stage for p in plans}

    def fresh(plan) -> float:
        return StageCosts(search.graph, search.profile, search.cost_model).bubble_floor(plan, may_offload=False)

    stages = search._stages(plans[0])  # nor its stages (member_bounds._bubble_floor)
    staged = [group.plan(zero=zero, grads=grads, stages=stages, **kw) for zero, grads in choices]
    for plan in plans + staged:
        assert fresh(plan) == fresh(first[plan.zero_stage]), plan.describe()


@pytest.mark.parametrize(("schedule", "v", "recompute"), [("interleaved_zb", 2, "full"), ("1f1b", 1, "none")])
def test_a_member_s_stage_totals_memo_omits_its_gradient_sync(search, group, schedule, v, recompute):
    """member_bounds._stage_totals keys one tp_plan's members on their stages, timing plan's recompute, schedule,
    virtual stages, overlap and tp context: each member's answer equals a fresh StageCosts' (nothing memoised)."""
    kw = {**_kw(search, group, schedule, v), "recompute": recompute}
    stages = search._stages(group.plan(zero=0, **kw))
    extras: dict = {}
    for zero, grads in _choices(search, group):
        plan = group.plan(zero=zero, grads=grads, stages=stages, **kw)
        fresh = StageCosts(search.graph, search.profile, search.cost_model)
        assert _stage_totals(search, plan, stages, extras) == fresh.stage_totals(search.budgets.timing(plan), stages)
    zeros = {zero for zero, _ in _choices(search, group)}
    assert 1 < len([key for key in extras if key[0] == "totals"]) <= len(zeros) < len(_choices(search, group))
