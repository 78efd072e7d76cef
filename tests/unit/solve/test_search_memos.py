"""What the search's memos assume (solve/search.py): ``step_extras_s`` is shared by every member of a tp
choice with the same tp overlap, ZeRO choice and stage parameters, so it must read no schedule, recompute
or stages; a memo that held where this fails would bound a plan by another's extras. So are the states floor and
the stage parameters' floor (member_bounds._per_overlap), which must read none of them either."""

from synthetic import synthetic_gpt, synthetic_profile

from autoplan.solve.candidates import SearchOptions
from autoplan.solve.pins import parse_fixes
from autoplan.solve.search import Search


def test_step_extras_read_no_schedule_recompute_or_stages():
    graph = synthetic_gpt(layers=4, hidden=512, heads=8, vocab=8000, seq=256, batch=16)
    search = Search(graph, synthetic_profile(), SearchOptions(devices=16, batch_size=16, allow_lossy=True))
    names = dict(model=graph.model_name, profile=search.profile.name)
    groups = [g for _, g in search.groups() if g.degrees.pp > 1 and g.degrees.dp > 1][:6]
    assert groups
    compared = 0
    for g in groups:
        tp_plan = search._choose(g).tp_plan
        options = search._stage_options(g)
        assert len({(recompute, sv) for _, recompute, sv in options}) > 1
        for zero, grads in search._dp_choices(g.degrees):
            for overlap in {o for o, _, _ in options}:
                floored, unfloored, states = set(), set(), set()
                for _, recompute, (schedule, v, _) in [item for item in options if item[0] == overlap]:  # at g's k
                    kw = dict(recompute=recompute, schedule=schedule, v=v, zero=zero, grads=grads, **names)
                    plan = g.plan(tp_plan=tp_plan, tp_overlap=overlap, **kw)
                    staged = g.plan(tp_plan=tp_plan, tp_overlap=overlap, stages=search._stages(plan), **kw)
                    for p in (plan, staged):
                        floored.add(search.bounds.step_extras_s(p, stage_params=1e8, params_floor=1e8))
                        unfloored.add(search.bounds.step_extras_s(p, stage_params=1e8))
                        states.add((search.bounds.states_floor_bytes(p), search.bounds.stage_params_floor(p)))
                        compared += 1
                assert len(floored) == len(unfloored) == len(states) == 1, (g, zero, grads, overlap, floored, states)
    assert compared > 100


def test_each_member_bound_memo_sees_one_group_so_one_micro_batch_count(monkeypatch):
    """member_bounds' memos (``extras``: _per_overlap, _bubble_floor, _stage_totals, member_bound's extras) leave
    out m and every other field a group fixes: one dict per _Choice (best_first.py), so per group and tp_plan, and
    every plan asked with it is that group's (Group.plan: num_microbatches = g.m; the budgets' timing plans copy
    it). A search with several m per degrees (micro-batch sizes 1, 2, 4) checks that each dict meets one m."""
    from autoplan.solve import member_bounds

    seen: dict[int, set] = {}
    kept = []  # the dicts, held so that their ids stay theirs

    def spy(name, at):
        original = getattr(member_bounds, name)

        def wrapped(search, g, plan, *args):
            extras = args[at]
            kept.append(extras)
            seen.setdefault(id(extras), set()).add((g, g.m, plan.num_microbatches))
            return original(search, g, plan, *args)

        monkeypatch.setattr(member_bounds, name, wrapped)

    spy("whatever_the_stages", -2)  # (..., dp_choices, extras, sends)
    spy("member_bound", -1)  # (..., at, extras)
    graph = synthetic_gpt(layers=8, hidden=512, heads=8, vocab=8000, seq=256, batch=32)
    options = SearchOptions(devices=8, batch_size=32, keep=300)
    Search(graph, synthetic_profile(memory_bytes=8 * 2**30), options).run()
    assert len(seen) > 5 and len({m for marks in seen.values() for _, m, _ in marks}) > 2
    assert all(type(kept_dict) is dict for kept_dict in kept)
    for marks in seen.values():
        assert len(marks) == 1 and all(g_m == m for _, g_m, m in marks), marks


def test_a_members_states_floor_is_its_options_and_the_pass_reads_no_other(monkeypatch):
    """best_first.py reads a member's states floor (Search._over_floor, Pass._states_over, the recompute budgets'
    member_bounds.may_budget) from its option's (member_bounds.states_floor_bytes: _per_overlap's, by ZeRO choice),
    each equal to Bounds.states_floor_bytes of the member itself: none reads Bounds.states_floor_bytes."""
    import sys

    from autoplan.solve import member_bounds

    graph = synthetic_gpt(layers=8, hidden=512, heads=8, vocab=8000, seq=256, batch=32)
    options = SearchOptions(devices=8, batch_size=32, keep=100, allow_lossy=True)
    search = Search(graph, synthetic_profile(memory_bytes=int(0.4 * 2**30)), options)
    plain, original, over = search.bounds.states_floor_bytes, member_bounds.states_floor_bytes, Search._over_floor
    counts = {"by the pass": 0, "members": 0, "over": 0}

    def counted(plan):
        counts["by the pass"] += sys._getframe(1).f_code.co_name in ("_over_floor", "_states_over", "may_budget")
        return plain(plan)

    def checked(search_, plan, at, extras):
        counts["members"] += 1
        assert (value := original(search_, plan, at, extras)) == plain(plan), plan.describe()
        return value

    def over_counted(self, *args, **kw):
        counts["over"] += 1
        return over(self, *args, **kw)

    monkeypatch.setattr(search.bounds, "states_floor_bytes", counted)
    monkeypatch.setattr(member_bounds, "states_floor_bytes", checked)
    monkeypatch.setattr(Search, "_over_floor", over_counted)
    assert search.run().best is not None
    assert counts["over"] > 500 and counts["members"] > counts["over"] and counts["by the pass"] == 0, counts


def test_step_extras_are_read_at_the_groups_schedule_steps(monkeypatch):
    """member_bounds' step_extras_s memos (_per_overlap, member_bound's) key no schedule steps, and a member may enter
    at a larger k (interleaved_zb at m / k only: solve/schedule_steps.py): a larger k sends ZeRO-2/3's per-step
    messages k times (its extras no less, more for some), so both read the plan at the group's k, a floor of every
    k of its members. Here every member enters at k = 2 (30 micro-batches, schedule pinned)."""
    from autoplan.solve import member_bounds
    from autoplan.solve.schedule_steps import larger_steps, with_steps

    graph = synthetic_gpt(layers=4, hidden=512, heads=8, vocab=1024, seq=256, batch=60)
    fixes = parse_fixes("tp=1,pp=4,mbs=1,schedule=interleaved_zb")
    options = SearchOptions(devices=8, batch_size=60, fixes=fixes)
    search = Search(graph, synthetic_profile(memory_bytes=4 * 2**30), options)
    plain, bounded, read, members = search.bounds.step_extras_s, member_bounds.member_bound, [], []

    def extras(plan, **kw):
        read.append(plan.schedule_steps)
        return plain(plan, **kw)

    def bound(search_, g, plan, *args):
        members.append(plan)
        return bounded(search_, g, plan, *args)

    monkeypatch.setattr(search.bounds, "step_extras_s", extras)
    monkeypatch.setattr(member_bounds, "member_bound", bound)
    assert search.run().best.schedule_steps > 1
    assert members and min(p.schedule_steps for p in members) == 2 and set(read) == {1}
    rises = []
    for plan in {p.zero_stage: p for p in members}.values():  # each ZeRO stage's: at 1 no more than at any k
        one = plain(with_steps(plan, 1), stage_params=1e8)
        costs = [plain(with_steps(plan, k), stage_params=1e8) for k in (2, *larger_steps(plan))]
        assert all(c >= one for c in costs), plan.describe()
        rises.append(costs[-1] > one)
    assert any(rises)


def test_a_member_whose_states_alone_exceed_the_device_is_never_bounded_by_its_stages(monkeypatch):
    """Pass._states_over sets such a member aside at its option's bound, before its partition's stage times are read
    for bound (2): no stage times make it fit. Its row still says why (the states' floor), and the pruned search keeps
    the best plan of pricing everything (tests/unit/solve/test_best_first.py)."""
    from autoplan.solve import member_bounds

    graph = synthetic_gpt(layers=8, hidden=512, heads=8, vocab=8000, seq=256, batch=32)
    options = SearchOptions(devices=8, batch_size=32, keep=100)
    search = Search(graph, synthetic_profile(memory_bytes=int(0.3 * 2**30)), options)
    original, bounded = member_bounds.member_bound, []

    def recorded(search_, g, plan, at, extras):
        bounded.append(search_.bounds.states_floor_bytes(plan) <= search_._usable_bytes)
        return original(search_, g, plan, at, extras)

    monkeypatch.setattr(member_bounds, "member_bound", recorded)
    result = search.run()
    assert result.best is not None and bounded and all(bounded)
    states_rows = [c for c in result.candidates if "optimizer state alone need" in (c.reason or "")]
    assert states_rows and all(c.status == "pruned" and c.cost is None for c in states_rows)
