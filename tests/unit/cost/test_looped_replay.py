"""interleaved_zb's bubble as torch's order runs it (cost/pp/looped_replay.py): the closed form
(p - 1) max(F, B, F + B - W) / v without re-runs, and under recomputation a replay of torch's own
``pipeline_order`` with each backward pass's re-runs; the search's floors stay below both."""

from __future__ import annotations

import random

import pytest
from torch_zb_orders import DONE, replay_span, torch_order

from autoplan.cost.pp.looped_replay import looped_span_s
from autoplan.cost.pp.reruns import forward_reruns
from autoplan.cost.pp.schedule import bubble_floor, stage_bubble_s
from autoplan.cost.pp.zero_bubble import bubble_share
from autoplan.cost.stages import StageTotals
from autoplan.types import Plan
from autoplan.types.schedules import zero_bubble_rounds


def _plan(pp: int, v: int, m: int) -> Plan:
    return Plan(devices=pp, pp=pp, dp=1, tp=1, micro_batch_size=1, num_microbatches=m, schedule="interleaved_zb",
                virtual_stages=v)  # fmt: skip


def _stage(rng: random.Random, *, pp: int, v: int, m: int, k: int) -> StageTotals:
    """Stage k of an interleaved_zb plan with random F, B, W and random re-runs of its chunks k + j p."""
    stage = StageTotals(fwd_s=rng.uniform(0.1, 1.0), bwd_s=rng.uniform(0.1, 2.0))
    stage.wgrad_s = rng.uniform(0.0, stage.bwd_s)
    for chunk in range(k, pp * v, pp):
        stage.chunk_rerun_s[chunk] = rng.choice([0.0, rng.uniform(0.0, stage.fwd_s / v)])
        stage.recompute_s += (
            forward_reruns(schedule="interleaved_zb", pp=pp, num_microbatches=m, chunk=chunk)
            * (stage.chunk_rerun_s[chunk])
        )
    return stage


@pytest.mark.parametrize("pp", [2, 3, 4])
@pytest.mark.parametrize("v", [1, 2])
def test_a_recomputing_stage_is_priced_as_torchs_order_replays(pp, v):
    """stage_bubble_s of a recomputing stage k: torch's own order replayed with each backward pass's re-run (the
    stage's re-runs of its chunk k + j p, n_(k+jp) R, spread over every rank's own passes of its chunk on leg j,
    counted from torch's actions), less the stage's m micro-batches; several m, every stage."""
    rng = random.Random(100 * pp + v)
    for m in (pp, pp + 1, 2 * pp, 3 * pp):
        if m % zero_bubble_rounds(pp=pp, num_microbatches=m):
            continue
        order = torch_order(pp=pp, v=v, m=m)
        passes = [0] * (pp * v)  # each chunk's backward passes in torch's actions: its Ws and its B's but chunk 0's
        for a in (a for actions in order.values() for a in actions):
            kind, c = DONE[a.computation_type], a.stage_index
            passes[c] += kind == "W" or (kind == "B" and c > 0)
        for k in range(pp):
            stage = _stage(rng, pp=pp, v=v, m=m, k=k)
            leg = [passes[k + j * pp] * stage.chunk_rerun_s[k + j * pp] for j in range(v)]
            units = [leg[c // pp] / passes[c] for c in range(pp * v)]
            f, w = stage.forward_s, stage.wgrad_s
            b = stage.micro_batch_s - f - w - sum(leg) / m
            span = replay_span(order, chunks=pp * v, f=f / v, b=b / v, w=w / v, units=units)
            assert stage_bubble_s(_plan(pp, v, m), stage) == pytest.approx(span - m * stage.micro_batch_s, abs=1e-9)


def test_without_reruns_the_replay_is_the_closed_form():
    """(p - 1) max(F, B, F + B - W) / v on every (p, v, m) torch runs, F, B, W each 0 or not."""
    rng = random.Random(5)
    for pp in range(2, 7):
        for v in (1, 2, 3):
            for m in range(pp, 4 * pp + 1):
                if m % zero_bubble_rounds(pp=pp, num_microbatches=m):
                    continue
                f, b, w = (rng.choice([0.0, rng.uniform(0.0, 2.0)]) for _ in range(3))
                span = looped_span_s(pp=pp, virtual_stages=v, m=m, f=f / v, b=b / v, w=w / v)
                want = (pp - 1) / v * max(f, b, f + b - w)
                assert span - m * (f + b + w) == pytest.approx(want, abs=1e-9)


def test_the_zero_bubble_floors_stay_below_the_replayed_bubble():
    """Over random stages of random blocks, each with its most re-runs: bubble_floor at bubble_share's share
    (StageCosts.bubble_floor: (T - 2W - R) / T per block) and at the blocks' share without re-runs times the
    stage's time without them (Bounds.zero_bubble_share) stay below the priced bubble."""
    rng = random.Random(7)
    for _ in range(400):
        pp, v = rng.randint(2, 5), rng.choice([1, 2, 3])
        m = pp * rng.randint(1, 3)
        k = rng.randrange(pp)
        stage, parts, bare = StageTotals(), [], []
        for chunk in range(k, pp * v, pp):
            r_c = forward_reruns(schedule="interleaved_zb", pp=pp, num_microbatches=m, chunk=chunk)
            for _ in range(rng.randint(1, 3)):
                fwd, bwd = rng.uniform(0.01, 1.0), rng.uniform(0.01, 3.0)
                w, again = rng.uniform(0.0, bwd), rng.choice([0.0, fwd, rng.uniform(0.0, fwd)])
                parts.append((fwd + bwd + 2.0 * again, w, 2.0 * again))
                bare.append((fwd + bwd, w, 0.0))
                stage.fwd_s, stage.bwd_s, stage.wgrad_s = stage.fwd_s + fwd, stage.bwd_s + bwd, stage.wgrad_s + w
                stage.recompute_s += r_c * again
                stage.chunk_rerun_s[chunk] = stage.chunk_rerun_s.get(chunk, 0.0) + again
        priced = stage_bubble_s(_plan(pp, v, m), stage)
        floor = bubble_floor(schedule="interleaved_zb", pp=pp, virtual_stages=v, share=bubble_share(parts))
        assert priced >= floor * stage.micro_batch_s * (1 - 1e-12) - 1e-12
        without_s = stage.fwd_s + stage.bwd_s  # the stage's time without re-runs (>= bound (1)'s C_min / pp here)
        floor = bubble_floor(schedule="interleaved_zb", pp=pp, virtual_stages=v, share=bubble_share(bare))
        assert priced >= floor * without_s * (1 - 1e-12) - 1e-12
