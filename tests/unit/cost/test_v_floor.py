"""The V schedules' bubble floor (cost/pp/schedule.py bubble_floor, cost/pp/replay.py v_forward_share): never above
what the replay prices, over random per-block forward, backward, re-run and collective times on unequal stages, and
equal to it where F = B = W."""

from __future__ import annotations

import random

import pytest

from autoplan.cost.pp.replay import v_forward_share
from autoplan.cost.pp.schedule import bubble_floor, stage_bubble_s
from autoplan.cost.stages import StageTotals
from autoplan.types import Plan
from autoplan.types.schedules import V_SCHEDULES


def _v_plan(schedule: str, *, pp: int, m: int) -> Plan:
    return Plan(devices=pp, pp=pp, dp=1, tp=1, micro_batch_size=1, num_microbatches=m, schedule=schedule,
                virtual_stages=2)  # fmt: skip


def _random_stage(rng: random.Random, parts: list[tuple[float, float, float]]) -> StageTotals:
    """A stage of 1-4 random blocks (each part: forward, backward, the most its recompute re-runs), each re-running
    a random share of that, with random collectives and weight gradients, as cost/stages.py add_block sums them."""
    stage = StageTotals()
    for _ in range(rng.randint(1, 4)):
        fwd, bwd = rng.uniform(0.01, 1.0), rng.uniform(0.01, 3.0)
        most = fwd if rng.random() < 0.5 else rng.uniform(0.0, fwd)  # full recompute, or selective's re-run
        parts.append((fwd, bwd, most))
        stage.fwd_s += fwd
        stage.bwd_s += bwd
        stage.wgrad_s += rng.uniform(0.0, bwd)
        stage.recompute_s += most * rng.choice([0.0, rng.random(), 1.0])  # a budget recomputes fewer blocks
        stage.tp_s += rng.choice([0.0, rng.uniform(0.0, 1.0)])
        stage.ep_s += rng.choice([0.0, rng.uniform(0.0, 1.0)])
        stage.cp_s += rng.choice([0.0, rng.uniform(0.0, 0.5)])
    return stage


@pytest.mark.parametrize("schedule", V_SCHEDULES)
def test_the_v_floor_never_exceeds_the_replayed_bubble(schedule):
    """Over 300 random plans of 2-8 unequal stages: the slowest stage's priced bubble (CostModel's stage_bubble_s)
    is at least bubble_floor at the forward share of every block of every stage, times that stage's time."""
    rng = random.Random(7)
    for _ in range(300):
        pp = rng.randint(2, 8)
        plan = _v_plan(schedule, pp=pp, m=rng.randint(2 * pp, 4 * pp))
        parts: list[tuple[float, float, float]] = []
        stages = [_random_stage(rng, parts) for _ in range(pp)]
        slowest = max(stages, key=lambda s: s.micro_batch_s)  # as CostModel._time picks it
        share = v_forward_share(parts)
        assert 0 < share <= slowest.forward_s / slowest.micro_batch_s
        floor = bubble_floor(schedule=schedule, pp=pp, virtual_stages=2, forward_share=share)
        assert stage_bubble_s(plan, slowest) >= floor * slowest.micro_batch_s * (1 - 1e-12)


@pytest.mark.parametrize("schedule", V_SCHEDULES)
@pytest.mark.parametrize("pp", [2, 4, 8])
def test_the_v_floor_is_the_replayed_bubble_at_equal_times(schedule, pp):
    """F = B = W (a chunk's forward, input and weight gradients alike): both schedules replay to (p - 1) chunk
    forwards, the floor itself."""
    stage = StageTotals(fwd_s=1.0, bwd_s=2.0, wgrad_s=1.0)
    floor = bubble_floor(schedule=schedule, pp=pp, virtual_stages=2, forward_share=v_forward_share([(1.0, 2.0, 0.0)]))
    assert floor == pytest.approx((pp - 1) / 6)
    assert stage_bubble_s(_v_plan(schedule, pp=pp, m=4 * pp), stage) == pytest.approx(floor * stage.micro_batch_s)


def test_an_unknown_forward_share_leaves_the_v_floor_at_zero():
    assert v_forward_share([]) == 0.0 and v_forward_share([(0.0, 0.0, 0.0)]) == 0.0
    assert bubble_floor(schedule="zbv", pp=4, virtual_stages=2) == 0.0
