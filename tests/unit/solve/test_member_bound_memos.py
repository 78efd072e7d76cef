"""member_bounds' memos of one _Choice's stage options (solve/member_bounds.py; ``extras``, one group's and one
tp_plan's): each keys on what its value reads that a stage option sets and leaves out the rest, so every stage
option's answer through one shared dict must equal the plain computation's, a fresh StageCosts' where it memoises:

- _first_per_context: the ZeRO stages whose tp contexts differ, by tp overlap (not recompute, schedule, v, k);
- _pp_comm_s: Bounds.pp_comm_s by tp overlap and virtual stages (not recompute, schedule, k);
- _slowest_stage_floor_s: StageCosts.slowest_stage_floor_s by recompute and tp overlap (not schedule, v, k);
- _steps_bubble at a k the group did not pin: as _bubble_floor with k (not stages or gradient sync);
and StageCosts.bubble_floor's shares read each distinct block summary once (the least of the parts' own)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from synthetic import synthetic_gpt, synthetic_profile
from synthetic.profiles import synthetic_host

from autoplan.solve import member_bounds
from autoplan.solve.candidates import SearchOptions
from autoplan.solve.pins import parse_fixes
from autoplan.solve.schedule_steps import larger_steps, with_steps
from autoplan.solve.search import Search
from autoplan.solve.stage_costs import StageCosts
from autoplan.types.schedule_steps import schedule_step_plan


@pytest.fixture(scope="module")
def search():
    graph = synthetic_gpt(layers=8, hidden=256, heads=8, vocab=1000, seq=128, batch=32)
    profile = replace(synthetic_profile(), host=synthetic_host())
    return Search(graph, profile, SearchOptions(devices=16, batch_size=32, allow_lossy=True))


@pytest.fixture(scope="module")
def group(search):
    """A group at pp = 2 and tp > 1 (both tp overlaps), whose stage options span several v and recomputes."""
    deg = lambda g: g.degrees  # noqa: E731
    return next(g for _, g in search.groups() if deg(g).pp == 2 and deg(g).tp > 1 and deg(g).dp > 1 and g.m >= 4)


def _bases(search, group) -> list:
    """Each stage option's plan without ZeRO or stages, as member_bounds.options makes it."""
    tp_plan, names = search._choose(group).tp_plan, dict(model="m", profile="p")
    options = search._stage_options(group)
    assert len({o for o, _, _ in options}) == 2 and len({v for *_, (_, v, _) in options}) > 1
    assert len({r for _, r, _ in options}) > 1
    kw = [dict(recompute=r, schedule=s, v=v, tp_overlap=o, steps=k) for o, r, (s, v, k) in options]
    return [group.plan(zero=0, tp_plan=tp_plan, **names, **each) for each in kw]


def _kw(base) -> dict:
    kw = dict(recompute=base.recompute, schedule=base.schedule, v=base.virtual_stages, tp_plan=base.tp_plan)
    return dict(kw, tp_overlap=base.tp_comm_overlap, model="m", profile="p", steps=base.schedule_steps)


@pytest.mark.parametrize("offload", [False, True])
def test_the_bubble_floor_of_a_zero_stage_per_context_is_the_least_of_every_zero_choice(search, group, offload):
    dp_choices, extras, fewer = search._dp_choices(group.degrees), {}, False
    for base in _bases(search, group):
        fresh = StageCosts(search.graph, search.profile, search.cost_model)  # nothing memoised
        kw = _kw(base)
        every = min(fresh.bubble_floor(p, may_offload=offload) for p in group.plans(dp_choices, **kw))
        firsts = member_bounds._first_per_context(search, group, kw, dp_choices, extras)
        least = min(fresh.bubble_floor(group.plan(zero=z, grads=g, **kw), may_offload=offload) for z, g in firsts)
        assert least == every, base.describe()
        fewer |= len(firsts) < len(member_bounds._first_per_zero(dp_choices))
    assert fewer and len([k for k in extras if k[0] == "contexts"]) == 2  # one per tp overlap


def test_the_sends_are_read_once_per_tp_overlap_and_virtual_stages(search, group):
    extras: dict = {}
    for base in _bases(search, group):
        assert member_bounds._pp_comm_s(search, base, extras) == search.bounds.pp_comm_s(base), base.describe()
    distinct = {(b.tp_comm_overlap, b.virtual_stages) for b in _bases(search, group)}
    assert len([k for k in extras if k[0] == "sends"]) == len(distinct) < len(_bases(search, group))


def test_the_slowest_stage_floor_is_read_once_per_recompute_and_tp_overlap(search, group):
    extras: dict = {}
    for base in _bases(search, group):
        fresh = StageCosts(search.graph, search.profile, search.cost_model)
        plain = fresh.slowest_stage_floor_s(base)
        assert member_bounds._slowest_stage_floor_s(search, base, extras) == plain, base.describe()
    distinct = {(b.recompute, b.tp_comm_overlap) for b in _bases(search, group)}
    assert len([k for k in extras if k[0] == "slowest floor"]) == len(distinct) < len(_bases(search, group))


def test_a_member_s_bubble_at_a_larger_k_is_read_once_per_option_zero_stage_and_k():
    """member_bounds._steps_bubble at a k its group did not pin: keyed as _bubble_floor, with k; members apart in
    their stages or gradient sync, and options apart in schedule, v or recompute, each get the plain least over k."""
    graph = synthetic_gpt(layers=8, hidden=256, heads=8, vocab=1000, seq=128, batch=60)
    options = SearchOptions(devices=8, batch_size=60, fixes=parse_fixes("tp=1,pp=2,mbs=1"))
    search = Search(graph, synthetic_profile(memory_bytes=4 * 2**30), options)
    group = next(g for _, g in search.groups() if g.degrees.dp == 4)
    tp_plan, dp_choices, extras, asked = search._choose(group).tp_plan, search._dp_choices(group.degrees), {}, []
    for _, recompute, (schedule, v, _) in search._stage_options(group):
        for k in (2, 3):
            kw = dict(recompute=recompute, schedule=schedule, v=v, tp_plan=tp_plan, model="m", profile="p", steps=k)
            stages = search._stages(group.plan(zero=0, **kw))
            for zero, grads in dp_choices:
                for plan in (
                    group.plan(zero=zero, grads=grads, **kw),
                    group.plan(zero=zero, grads=grads, stages=stages, **kw),
                ):
                    fresh = StageCosts(search.graph, search.profile, search.cost_model).bubble_floor
                    steps = [plan] + [with_steps(plan, j) for j in larger_steps(plan)]
                    plain = min(p.schedule_steps * fresh(schedule_step_plan(p), may_offload=False) for p in steps)
                    assert member_bounds._steps_bubble(search, group, plan, False, extras) == plain, plan.describe()
                    asked.append((recompute, schedule, v, zero, k))
    read = [key for key in extras if key[0] == "steps bubble"]
    assert 1 < len(read) == len(set(asked)) < len(asked) / 2


@pytest.mark.parametrize(("schedule", "v", "recompute"), [("interleaved_zb", 2, "full"), ("zbv", 2, "selective")])
def test_a_bubble_share_reads_each_distinct_block_summary_once(search, group, schedule, v, recompute, monkeypatch):
    """StageCosts.bubble_floor's shares (zero-bubble, V) are the least of their parts' own, so each distinct block
    summary is read once (identical blocks share one): the floor equals the one taken over every block."""
    from autoplan.cost import block_time_s, bubble_floor, rerun_s
    from autoplan.cost.pp.replay import v_forward_share
    from autoplan.cost.pp.reruns import chunk_forward_reruns, plan_forward_reruns
    from autoplan.cost.pp.zero_bubble import bubble_share
    from autoplan.solve import stage_costs

    kw = dict(recompute=recompute, schedule=schedule, v=v, tp_plan=search._choose(group).tp_plan, model="m")
    plan = group.plan(zero=0, profile="p", **kw)
    fresh = StageCosts(search.graph, search.profile, search.cost_model)
    ctx = fresh.context(plan)
    blocks = list(fresh.cost_model.block_summaries(plan.tp_plan, ctx, plan.tp_comm_overlap).values())
    pre, post = fresh.cost_model.outside_summaries(plan.tp_plan, ctx, plan.tp_comm_overlap)
    if schedule == "interleaved_zb":
        most = plan_forward_reruns(plan, 1)
        parts = [(block_time_s(b, recompute, most), b.wgrad_s, most * rerun_s(b, recompute)) for b in blocks]
        outside = [(pre.fwd_s + pre.bwd_s, pre.wgrad_s, 0.0), (post.fwd_s + post.bwd_s, post.wgrad_s, 0.0)]
        shares = dict(share=bubble_share(parts + outside))
    else:
        most = max(chunk_forward_reruns(plan))
        parts = [(b.fwd_s, b.bwd_s, most * b.selective_recompute_s) for b in blocks]
        shares = dict(
            forward_share=v_forward_share(parts + [(pre.fwd_s, pre.bwd_s, 0.0), (post.fwd_s, post.bwd_s, 0.0)])
        )
    plain = bubble_floor(schedule=schedule, pp=plan.pp, virtual_stages=v, **shares)
    read = []
    if schedule == "interleaved_zb":  # a block's re-runs, read once per part
        monkeypatch.setattr(stage_costs, "rerun_s", lambda b, r: read.append(b) or rerun_s(b, r))
    else:  # a block's forward, read once per part
        forward = property(lambda b: read.append(b) or b.__dict__["fwd_s"])
        monkeypatch.setattr(type(blocks[0]), "fwd_s", forward, raising=False)
    assert fresh.bubble_floor(plan, may_offload=False) == plain > 0
    ids = {id(b) for b in blocks}
    assert len([b for b in read if id(b) in ids]) == len(ids) < len(blocks)  # the outside nodes' aside
