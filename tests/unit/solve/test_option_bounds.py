"""member_bounds.options bounds each stage option of a tp_plan without partitions; what the options of one tp overlap
share (each ZeRO choice's step extras, whether any one's states alone fit) is computed once per overlap, and a ZeRO
choice's plan is made only where it is read. Each bound must equal the one made the plain way: every ZeRO choice's
plan made for every option, the budgets' timing asking each plan, the bubble floor of each plan, nothing shared."""

from __future__ import annotations

from dataclasses import replace

import pytest
from synthetic import synthetic_gpt, synthetic_profile

from autoplan.solve import member_bounds, moe_overlap
from autoplan.solve.best_first import Pass
from autoplan.solve.candidates import Group, SearchOptions
from autoplan.solve.search import Search


def _search(devices: int, memory_bytes: int) -> Search:
    graph = synthetic_gpt(layers=4, hidden=512, heads=8, vocab=8000, seq=256, batch=16)
    profile = synthetic_profile()
    profile = replace(profile, device=replace(profile.device, memory_bytes=memory_bytes))
    return Search(graph, profile, SearchOptions(devices=devices, batch_size=16, allow_lossy=True))


def _plain(search: Search, g: Group, base, bound: float, dp_choices: list, offload: bool, pp_s: float) -> list:
    """whatever_the_stages the plain way (module docstring)."""
    kw = dict(recompute=base.recompute, schedule=base.schedule, v=base.virtual_stages, tp_plan=base.tp_plan)
    kw.update(model=search.graph.model_name, profile=search.profile.name)
    plans = g.plans(dp_choices, tp_overlap=base.tp_comm_overlap, **kw)
    floor_s = search.stage_costs.slowest_stage_floor_s(search.budgets.timing(base, lambda: plans))
    bubble = min(search.stage_costs.bubble_floor(p, may_offload=offload) for p in plans)
    core_s = (g.m + bubble) * floor_s + pp_s - moe_overlap.hideable_s(search.stage_costs, base, search.fixes)
    params = search.bounds.stage_params_floor(base)
    extras = [search.bounds.step_extras_s(p, stage_params=params, params_floor=params) for p in plans]
    return [max(bound, search.objective(core_s + e, g.degrees.devices)) for e in extras]


@pytest.mark.parametrize(("devices", "memory_bytes", "fit"), [(16, 2**31, True), (8, 2**24, False)])
def test_option_bounds_equal_the_plain_ones_and_make_plans_once_per_overlap(devices, memory_bytes, fit, monkeypatch):
    """``fit``: whether the states of some ZeRO choice fit (a recompute budget's timing), else none's does."""
    search = _search(devices, memory_bytes)
    made, bubbles = [], []
    real, real_bubble = Group.plans, type(search.stage_costs).bubble_floor
    monkeypatch.setattr(Group, "plans", lambda self, *a, **kw: made.append(1) or real(self, *a, **kw))
    monkeypatch.setattr(
        type(search.stage_costs), "bubble_floor", lambda *a, **kw: bubbles.append(a[1]) or real_bubble(*a, **kw)
    )
    groups = [g for _, g in search.groups() if g.degrees.pp > 1][:4]
    assert groups
    fits, read, compared = set(), set(), 0
    for g in groups:
        choice, dp_choices, extras, pruned = search._choose(g), search._dp_choices(g.degrees), {}, []
        overlaps = {o for o, _, _ in search._stage_options(g)}
        with Pass(search, [])._floors():
            made.clear(), bubbles.clear()
            options = list(member_bounds.options(search, g, 0.0, choice, dp_choices, extras, pruned))
            assert len(made) == len(overlaps) < len(options)  # the ZeRO choices' plans: once per tp overlap
            reading = [
                search.stage_costs.bubble_reads_context(base, may_offload=offload)
                for base, _, (_, offload), _ in options
            ]  # a bubble floor per distinct tp context of a ZeRO stage where it reads its blocks
            contexts = [len(_contexts(search, g, base, dp_choices)) for base, *_ in options]
            assert len(bubbles) == sum(n if r else 1 for r, n in zip(reading, contexts))
            read |= set(reading)
            fits |= {shared.states_fit for shared in extras.values() if isinstance(shared, member_bounds._Shared)}
            for base, own, (pp_s, offload), subs in options:
                assert pp_s == search.bounds.pp_comm_s(base)
                assert subs == _plain(search, g, base, own, dp_choices, offload, pp_s), base.describe()
                compared += 1
    assert compared > 10 and fit in fits and read == {True, False}


def _contexts(search: Search, g: Group, base, dp_choices: list) -> set:
    """The distinct tp contexts (StageCosts.context) of ``base``'s ZeRO choices."""
    kw = dict(recompute=base.recompute, schedule=base.schedule, v=base.virtual_stages, tp_plan=base.tp_plan)
    plans = g.plans(dp_choices, tp_overlap=base.tp_comm_overlap, model="m", profile="p", **kw)
    return {search.stage_costs.context(p).key for p in plans}


def _plain_member(search: Search, g: Group, plan, at: tuple) -> float:
    """member_bound the plain way: the budgets' timing asking the plan's own states floor, its own bubble floor,
    nothing shared."""
    stages, own, (pp_s, offload), _ = at
    times, params = search.stage_costs.stage_totals(search.budgets.timing(plan), stages)
    bubble = search.stage_costs.bubble_floor(plan, may_offload=offload)
    core_s = (g.m + bubble) * max(times) + pp_s - moe_overlap.hideable_s(search.stage_costs, plan, search.fixes)
    extra_s = search.bounds.step_extras_s(plan, stage_params=max(params))
    return max(own, search.objective(core_s + extra_s, g.degrees.devices))


@pytest.mark.parametrize(("devices", "memory_bytes"), [(16, 2**31), (8, 2**24)])
def test_member_bounds_equal_the_plain_ones_and_read_no_states_floor(devices, memory_bytes, monkeypatch):
    """A member's bound (2) reads its ZeRO choice's states floor of its option (whatever_the_stages) and one bubble
    floor per (recompute, schedule, v, overlap, ZeRO stage) of its tp_plan."""
    search = _search(devices, memory_bytes)
    floors, bubbles = [], []
    real_floor, real_bubble = type(search.bounds).states_floor_bytes, type(search.stage_costs).bubble_floor
    g = next(g for _, g in search.groups() if g.degrees.pp > 1 and g.degrees.dp > 1)
    choice, dp_choices, extras = search._choose(g), search._dp_choices(g.degrees), {}
    names = dict(model=search.graph.model_name, profile=search.profile.name, tp_plan=choice.tp_plan)
    compared = 0
    with Pass(search, [])._floors():
        options = list(member_bounds.options(search, g, 0.0, choice, dp_choices, extras, []))
        monkeypatch.setattr(type(search.bounds), "states_floor_bytes", lambda *a: floors.append(1) or real_floor(*a))
        monkeypatch.setattr(
            type(search.stage_costs), "bubble_floor", lambda *a, **k: bubbles.append(1) or real_bubble(*a, **k)
        )
        for base, own, sends, _ in options:
            kw = dict(recompute=base.recompute, schedule=base.schedule, v=base.virtual_stages)
            kw.update(tp_overlap=base.tp_comm_overlap, **names)
            stages = search._stages(g.plan(zero=0, **kw))
            for i, (zero, grads) in enumerate(dp_choices):
                plan, at = g.plan(zero=zero, grads=grads, stages=stages, **kw), (stages, own, sends, i)
                floors.clear()
                bound = member_bounds.member_bound(search, g, plan, at, extras)
                assert not floors  # its option's states floor, not its own
                assert bound == _plain_member(search, g, plan, at), plan.describe()
                compared += 1
    zeros = {zero for zero, _ in dp_choices}
    assert compared > 10 and len(bubbles) - compared <= len(options) * len(zeros) < compared
