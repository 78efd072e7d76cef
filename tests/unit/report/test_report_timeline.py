"""The pipeline timeline: schedule orders, and makespans that match the bubble formula."""

from __future__ import annotations

import pytest

from autoplan.errors import AutoplanError
from autoplan.report.timeline import simulate, stage_order


@pytest.mark.parametrize("schedule,v", [("gpipe", 1), ("1f1b", 1), ("interleaved_1f1b", 2), ("interleaved_1f1b", 4)])
@pytest.mark.parametrize("pp,m", [(2, 4), (4, 8), (4, 12)])
def test_uniform_stages_take_m_plus_bubble(schedule, v, pp, m):
    """(m + (p - 1) / v) * (F + B): Narayanan et al. SC'21 section 2.2."""
    timeline = simulate(schedule=schedule, pp=pp, m=m, v=v, forward_s=[1.0] * pp, backward_s=[2.0] * pp)
    assert timeline.makespan_s == pytest.approx((m + (pp - 1) / v) * 3.0)
    for k in range(pp):
        assert timeline.busy_s(k, "forward") == pytest.approx(m * 1.0)
        assert timeline.busy_s(k, "backward") == pytest.approx(m * 2.0)
        assert timeline.busy_s(k, "idle") == pytest.approx(timeline.makespan_s - 3.0 * m)


def test_one_f_one_b_warms_up_then_alternates():
    order = stage_order("1f1b", pp=4, stage=1, m=6)
    kinds = "".join(kind[0].upper() for kind, _, _ in order)
    assert kinds == "FF" + "FB" * 4 + "BB"
    assert [mb for kind, mb, _ in order if kind == "backward"] == list(range(6))
    last = stage_order("1f1b", pp=4, stage=3, m=6)
    assert "".join(kind[0].upper() for kind, _, _ in last) == "FB" * 6


def test_sends_lengthen_the_step_and_the_tail_is_added():
    plain = simulate(schedule="1f1b", pp=2, m=4, v=1, forward_s=[1.0, 1.0], backward_s=[2.0, 2.0])
    sent = simulate(
        schedule="1f1b", pp=2, m=4, v=1, forward_s=[1.0, 1.0], backward_s=[2.0, 2.0], send_s=0.5, tail_s=0.25
    )
    assert sent.makespan_s > plain.makespan_s + 0.25
    assert sent.busy_s(0, "send") == pytest.approx(4 * 0.5)  # stage 0 sends only activations
    assert sent.busy_s(1, "send") == pytest.approx(4 * 0.5)  # stage 1 sends only gradients
    assert sent.busy_s(0, "sync") == pytest.approx(0.25)


def test_slowest_stage_sets_the_pace():
    timeline = simulate(schedule="gpipe", pp=2, m=4, v=1, forward_s=[1.0, 2.0], backward_s=[2.0, 4.0])
    assert timeline.makespan_s == pytest.approx(1.0 + 4 * 2.0 + 4 * 4.0 + 2.0)


def test_stage_count_mismatch_is_a_clear_error():
    with pytest.raises(AutoplanError, match="stage times"):
        simulate(schedule="1f1b", pp=2, m=2, v=1, forward_s=[1.0], backward_s=[2.0])


@pytest.mark.parametrize("pp,v,m", [(2, 1, 4), (4, 1, 8), (4, 2, 8), (4, 2, 6)])
def test_the_zero_bubble_timeline_runs_torchs_order_with_the_priced_bubble(pp, v, m):
    """Each stage runs the F/B/W order torch's ScheduleInterleavedZeroBubble builds, and the step lasts
    m (F + B + W) + (p - 1)(F + B - W) / v (cost/pp/zero_bubble.py) with W half the backward."""
    import types

    import torch
    from torch.distributed.pipelining.schedules import ScheduleInterleavedZeroBubble

    kinds = {"FORWARD": "forward", "BACKWARD_INPUT": "backward", "BACKWARD_WEIGHT": "weight"}
    for k in range(pp):
        stages = [
            types.SimpleNamespace(num_stages=pp * v, group_size=pp, group_rank=k, submod=torch.nn.Linear(1, 1))
            for _ in range(v)
        ]
        actions = [a for a in ScheduleInterleavedZeroBubble(stages, m).pipeline_order[k] if a is not None]
        torch_order = [(kinds[a.computation_type.name], a.microbatch_index, a.stage_index // pp) for a in actions]
        assert stage_order("interleaved_zb", pp=pp, stage=k, m=m, v=v) == torch_order
    timeline = simulate(schedule="interleaved_zb", pp=pp, m=m, v=v, forward_s=[1.0] * pp, backward_s=[2.0] * pp)
    assert timeline.makespan_s == pytest.approx(m * 3.0 + (pp - 1) * (1.0 + 1.0 - 1.0) / v)
    assert timeline.busy_s(0, "weight") == pytest.approx(m * 1.0)


@pytest.mark.parametrize("schedule", ["zbv", "dualpipev"])
@pytest.mark.parametrize("pp,m", [(2, 4), (4, 8), (8, 16)])
def test_a_v_timeline_runs_torchs_order_as_the_cost_model_replays_it(schedule, pp, m):
    """Two chunks per stage in the V (types/layout.py), the turn unsent, torch's order of each stage: the step
    lasts the replay's span (cost/pp/replay.py), and DualPipeV's F&B pairs run forward, then backward."""
    from autoplan.cost.pp.replay import replay_span_s

    timeline = simulate(schedule=schedule, pp=pp, m=m, v=2, forward_s=[1.0] * pp, backward_s=[2.0] * pp, send_s=0.1)
    sends = [s for s in timeline.segments if s.kind == "send"]
    assert len(sends) == 2 * m * (2 * pp - 2)  # every boundary forward and back but the V's turn
    plain = simulate(schedule=schedule, pp=pp, m=m, v=2, forward_s=[1.0] * pp, backward_s=[2.0] * pp)
    assert plain.makespan_s == pytest.approx(replay_span_s(schedule=schedule, pp=pp, m=m, f=0.5, b=0.5, w=0.5))
    assert plain.busy_s(0, "weight") == pytest.approx(m * 1.0)


@pytest.mark.parametrize("schedule, v", [("1f1b", 1), ("interleaved_1f1b", 2), ("zbv", 2)])
def test_schedule_steps_run_the_schedule_k_times_end_to_end(schedule, v):
    """Plan.schedule_steps k (timeline.png): k schedule steps of m / k, each filling and draining, micro-batches
    numbered on across the steps, the tail once."""
    kw = dict(schedule=schedule, pp=2, v=v, forward_s=[1.0, 1.0], backward_s=[2.0, 2.0])
    one = simulate(m=4, **kw)
    steps = simulate(m=8, schedule_steps=2, tail_s=0.5, **kw)
    assert steps.makespan_s == pytest.approx(2 * one.makespan_s + 0.5)
    chunks = [s for s in steps.segments if s.kind in ("forward", "backward", "weight")]
    assert sorted({s.microbatch for s in chunks}) == list(range(8))
    first, second = [[s for s in chunks if (s.microbatch >= 4) == later] for later in (False, True)]
    assert max(s.end_s for s in first) <= min(s.start_s for s in second)
    assert sum(s.end_s - s.start_s for s in steps.segments if s.kind == "idle") == pytest.approx(
        2 * sum(s.end_s - s.start_s for s in one.segments if s.kind == "idle")
    )
