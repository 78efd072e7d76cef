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
    made = []
    real = Group.plans
    monkeypatch.setattr(Group, "plans", lambda self, *a, **kw: made.append(1) or real(self, *a, **kw))
    groups = [g for _, g in search.groups() if g.degrees.pp > 1][:4]
    assert groups
    fits, compared = set(), 0
    for g in groups:
        choice, dp_choices, extras, pruned = search._choose(g), search._dp_choices(g.degrees), {}, []
        overlaps = {o for o, _, _ in search._stage_options(g)}
        with Pass(search, [])._floors():
            made.clear()
            options = list(member_bounds.options(search, g, 0.0, choice, dp_choices, extras, pruned))
            assert len(made) == len(overlaps) < len(options)  # the ZeRO choices' plans: once per tp overlap
            fits |= {shared.states_fit for shared in extras.values() if isinstance(shared, member_bounds._Shared)}
            for base, own, (pp_s, offload), subs in options:
                assert subs == _plain(search, g, base, own, dp_choices, offload, pp_s), base.describe()
                compared += 1
    assert compared > 10 and fit in fits
