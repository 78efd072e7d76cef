"""The V schedules' replay prices each backward's own re-runs (cost/pp/replay.py, cost/pp/reruns.py v_rerun_units):
a backward split into B and W re-runs a recomputed block in each, a whole one once, and the first chunk once (its
W runs the full backward). Summed over the micro-batches, a chunk's backwards re-run what reruns.py's r_c prices,
and the bubble is that of the order replayed with those times (an independent replay below)."""

from __future__ import annotations

import random

import pytest

from autoplan.cost.pp import replay
from autoplan.cost.pp.reruns import forward_reruns, v_rerun_units
from autoplan.cost.pp.schedule import stage_bubble_s
from autoplan.cost.pp.v_orders import v_order
from autoplan.cost.stages import StageTotals
from autoplan.types import Plan
from autoplan.types.layout import stage_of_chunk
from autoplan.types.schedules import V_SCHEDULES

BACKWARDS = ("B", "W", "BW", "FB")


def _rerun_passes(action: tuple) -> tuple[int, int]:
    """(the chunk whose backward ``action`` runs, the backward passes it runs there: B 1, W 1, whole 1; chunk
    0's B none), counted from torch's actions, not from replay.py."""
    kind, chunk = action[0], action[3] if action[0] == "FB" else action[1]
    return chunk, 0 if (kind == "B" and chunk == 0) or kind == "F" else 1


@pytest.mark.parametrize("schedule", V_SCHEDULES)
@pytest.mark.parametrize("pp,extra", [(2, 0), (3, 1), (4, 0), (4, 5), (6, 2)])
def test_each_chunks_backwards_rerun_what_r_c_prices(schedule, pp, extra):
    """Per rank replaying stage k's work: the re-run seconds its actions carry (replay.py _seconds_of less the
    kind's own) sum, per chunk of stage k, to m r_c R_c (forward_reruns), and on every rank to the stage's total."""
    m, rng = 2 * pp + extra, random.Random(pp * 31 + extra)
    seconds = replay._durations(0.3, 0.5, 0.2)
    for k in range(pp):
        legs = (rng.uniform(0.01, 1.0), rng.uniform(0.01, 1.0))
        units, total = v_rerun_units(schedule, pp=pp, m=m, rank=k, rerun_s=legs)
        for rank, actions in enumerate(v_order(schedule, pp=pp, m=m)):
            got: dict[int, float] = {}
            for action in actions:
                kinds = [("F", action[1]), ("BW", action[3])] if action[0] == "FB" else [(action[0], action[1])]
                for key in kinds:
                    got[key[1]] = got.get(key[1], 0.0) + replay._seconds_of(key, seconds, units) - seconds[key[0]]
            assert sum(got.values()) == pytest.approx(total)
            if rank == k:
                for c, leg in ((k, legs[0]), (2 * pp - 1 - k, legs[1])):
                    r_c = forward_reruns(schedule=schedule, pp=pp, num_microbatches=m, chunk=c)
                    assert got[c] == pytest.approx(m * r_c * leg)


def test_split_and_whole_backwards_of_one_chunk_price_apart():
    """DualPipeV runs some of a chunk's backwards split and the rest whole: a split one (B + W) takes one re-run
    more than a whole one, where a lumped price would give each the same."""
    pp, m = 4, 8
    units, _ = v_rerun_units("dualpipev", pp=pp, m=m, rank=1, rerun_s=(0.4, 0.4))
    seconds = replay._durations(0.3, 0.5, 0.2)
    actions = v_order("dualpipev", pp=pp, m=m)[1]
    chunk = next(a[1] for a in actions if a[0] == "B" and a[1] > 0)
    assert any(a[0] in ("BW", "FB") and (a[3] if a[0] == "FB" else a[1]) == chunk for a in actions)
    split = replay._seconds_of(("B", chunk), seconds, units) + replay._seconds_of(("W", chunk), seconds, units)
    whole = replay._seconds_of(("BW", chunk), seconds, units)
    assert split - whole == pytest.approx(units[chunk]) and units[chunk] > 0


def _independent_span(schedule: str, *, pp: int, m: int, f: float, b: float, w: float, units: list[float]) -> float:
    """An event replay of torch's V order (v_orders.py) with one chunk's f, b, w and each backward pass's re-run:
    F after the previous chunk's F, a backward after the next chunk's B (the last chunk's after its F), W after
    its B, an F&B pair as its F then its whole backward."""
    place = [stage_of_chunk(c, pp=pp, v_shape=True) for c in range(2 * pp)]
    queues = [
        [h for a in acts for h in ([("F", *a[1:3]), ("BW", *a[3:5])] if a[0] == "FB" else [a])]
        for acts in v_order(schedule, pp=pp, m=m)
    ]
    done: dict[tuple, float] = {}
    clock, at = [0.0] * pp, [0] * pp
    while any(at[r] < len(q) for r, q in enumerate(queues)):
        moved = False
        for r, queue in enumerate(queues):
            while at[r] < len(queue):
                kind, c, i = queue[at[r]]
                if kind == "F":
                    need = ("F", c - 1, i) if c > 0 else None
                elif kind == "W":
                    need = ("B", c, i)
                else:
                    need = ("B", c + 1, i) if c < 2 * pp - 1 else ("F", c, i)
                if need is not None and need not in done:
                    break
                rerun = units[c] * (kind != "F") * (not (kind == "B" and c == 0))
                clock[r] = max(clock[r], done.get(need, 0.0)) + {"F": f, "B": b, "W": w, "BW": b + w}[kind] + rerun
                done[("B" if kind == "BW" else kind, c, i)] = clock[r]
                at[r], moved = at[r] + 1, True
        assert moved and place
    return max(clock)


@pytest.mark.parametrize("schedule", V_SCHEDULES)
@pytest.mark.parametrize("pp,m,k", [(2, 4, 0), (2, 5, 1), (3, 6, 1), (4, 8, 2), (4, 11, 3)])
def test_the_bubble_replays_each_backwards_reruns(schedule, pp, m, k):
    """stage_bubble_s of a recomputing stage k: the independent replay's span less the stage's m micro-batches."""
    rng = random.Random(pp * m + k)
    legs = {k: rng.uniform(0.05, 0.5), 2 * pp - 1 - k: rng.uniform(0.05, 0.5)}
    reruns = {c: forward_reruns(schedule=schedule, pp=pp, num_microbatches=m, chunk=c) for c in legs}
    stage = StageTotals(fwd_s=0.6, bwd_s=1.3, wgrad_s=0.5)
    stage.chunk_rerun_s = legs
    stage.recompute_s = sum(reruns[c] * legs[c] for c in legs)
    plan = Plan(devices=pp, pp=pp, dp=1, tp=1, micro_batch_size=1, num_microbatches=m, schedule=schedule,
                virtual_stages=2)  # fmt: skip
    passes = [m] * (2 * pp)  # each chunk's backward passes: one per backward, two where split (not chunk 0's)
    for action in (a for acts in v_order(schedule, pp=pp, m=m) for a in acts if a[0] == "B" and a[1] > 0):
        passes[action[1]] += 1
    leg = [passes[k] * legs[k], passes[2 * pp - 1 - k] * legs[2 * pp - 1 - k]]
    units = [leg[c >= pp] / passes[c] for c in range(2 * pp)]  # every rank re-runs stage k's total
    span = _independent_span(schedule, pp=pp, m=m, f=0.3, b=0.4, w=0.25, units=units)
    assert stage_bubble_s(plan, stage) == pytest.approx(span - m * stage.micro_batch_s, abs=1e-9)


@pytest.mark.parametrize("schedule", V_SCHEDULES)
def test_the_v_floor_stays_below_the_bubble_with_each_backwards_reruns(schedule):
    """bubble_floor at the forward share of every block with its most re-runs (solve/stage_costs.py
    _forward_share) stays below the priced bubble of random recomputing stages: every rank replays the stage's
    re-run total, so the last rank still waits (p - 1) chunk forwards and then runs m T."""
    from autoplan.cost.pp.replay import v_forward_share
    from autoplan.cost.pp.schedule import bubble_floor

    rng = random.Random(11)
    for _ in range(200):
        pp = rng.randint(2, 6)
        m, k = rng.randint(2 * pp, 4 * pp), rng.randrange(pp)
        plan = Plan(devices=pp, pp=pp, dp=1, tp=1, micro_batch_size=1, num_microbatches=m, schedule=schedule,
                    virtual_stages=2)  # fmt: skip
        stage, parts = StageTotals(), []
        for chunk in (k, 2 * pp - 1 - k):
            r_c = forward_reruns(schedule=schedule, pp=pp, num_microbatches=m, chunk=chunk)
            for _ in range(rng.randint(1, 3)):
                fwd, bwd = rng.uniform(0.01, 1.0), rng.uniform(0.01, 3.0)
                again = fwd if rng.random() < 0.5 else rng.uniform(0.0, fwd)
                parts.append((fwd, bwd, 2.0 * again))
                stage.fwd_s, stage.bwd_s = stage.fwd_s + fwd, stage.bwd_s + bwd
                stage.wgrad_s += rng.uniform(0.0, bwd)
                stage.recompute_s += r_c * again
                stage.chunk_rerun_s[chunk] = stage.chunk_rerun_s.get(chunk, 0.0) + again
        floor = bubble_floor(schedule=schedule, pp=pp, virtual_stages=2, forward_share=v_forward_share(parts))
        assert stage_bubble_s(plan, stage) >= floor * stage.micro_batch_s * (1 - 1e-12)
