"""How many times a recomputed block's forward re-runs per micro-batch: the one rule every price of
recomputation reads (cost/stages.py add_block, the partition's block times, the zero-bubble and V bubble floors
in solve/stage_costs.py, the audit's priced FLOPs in cost/volumes.py).

torch's checkpoint re-runs a block at each backward pass's first unpack (utils/checkpoint.py 2.13,
``_checkpoint_hook.unpack_hook``, keyed by the graph task). A backward run whole is one pass: one re-run. A
split backward runs B (``stage_backward_input``) and W (``stage_backward_weight``, its parameter groups under one
``GraphExecGroup``: execute/weight_pass.py) as two passes: two re-runs, under full and selective recomputation
alike (selective's re-run runs no matmul: its policy serves their outputs). Which backwards are split, per torch
2.13's torch/distributed/pipelining:

- gpipe, 1f1b, interleaved_1f1b: every backward whole (FULL_BACKWARD): 1;
- chunk 0 under every schedule: 1 (stage.py ``backward_one_chunk``: the first stage's B runs nothing, its W
  runs a full backward, as its input needs no gradient);
- interleaved_zb, zbv: every other backward split (BACKWARD_INPUT then BACKWARD_WEIGHT): 2;
- dualpipev (``ScheduleDualPipeV._calculate_single_rank_operations``; autoplan's overlapped F&B pairs,
  execute/overlap_f_b.py, run the same actions): rank r's chunk 2p - 1 - r splits the p - r - 1 backwards of
  its step 3 and (r + 1) // 2 of step 6, its chunk r r // 2 + 1 of step 6 and the p - r - 1 of step 7; the
  rest of its m backwards are whole (steps 4-6: FULL_BACKWARD, OVERLAP_F_B's): 1 + splits / m, counted in
  cost/pp/v_orders.py's copy of torch's order (tests/unit/cost/test_recompute_reruns.py checks both against
  torch's ``pipeline_order``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from autoplan.cost.pp.v_orders import v_halves
from autoplan.cost.stored import stored
from autoplan.types.layout import chunks_of_stage, local_chunk, stage_of_chunk
from autoplan.types.schedules import SPLIT_BACKWARD, V_SCHEDULES


def forward_reruns(*, schedule: str, pp: int, num_microbatches: int, chunk: int) -> float:
    """Re-runs of a recomputed block of chunk ``chunk`` per micro-batch, averaged over the step (module docstring):
    1 + the share of its backwards that are split, counted in the V schedules' orders (cost/pp/v_orders.py)."""
    if chunk == 0 or schedule not in SPLIT_BACKWARD:
        return 1.0
    if schedule not in V_SCHEDULES:
        return 2.0
    return 1.0 + split_backwards(schedule, pp=pp, m=num_microbatches)[chunk] / num_microbatches


@stored(maxsize=None)  # one per (schedule, pp, m) a search meets
def split_backwards(schedule: str, *, pp: int, m: int) -> tuple[int, ...]:
    """Per chunk of a V ``schedule``, how many of its m backwards run as B then W: v_order's "B" actions ("BW" and an
    F&B pair's backward run whole), counted in each rank's halves (v_orders.py ``v_halves``: B is kind 1), built as
    repeated patterns rather than one action at a time (tests/unit/cost/test_reruns_memo.py holds them equal)."""
    counts = np.zeros(2 * pp, dtype=np.int64)
    for rank in range(pp):
        kinds, chunks = v_halves(schedule, pp=pp, m=m, rank=rank)
        counts += np.bincount(chunks[kinds == 1], minlength=2 * pp)
    return tuple(int(n) for n in counts)


def v_rerun_units(
    schedule: str, *, pp: int, m: int, rank: int, rerun_s: tuple[float, float]
) -> tuple[tuple[float, ...], float]:
    """(per chunk c of V ``schedule``'s 2p, the seconds of one re-run in the replay, cost/pp/replay.py; the step's
    re-run seconds on every rank), where every rank runs the work of stage ``rank``, whose chunks ``rank`` and
    2p - 1 - rank re-run once in ``rerun_s`` seconds (their recomputed blocks and collectives).

    A backward of chunk c runs n passes: a split one two (B, W), a whole one one, chunk 0's one, so c's m
    backwards run n_c = m + s_c passes (chunk 0: m), n_c = m :func:`forward_reruns`. The replay gives every
    rank that stage's times (cost/pp/schedule.py), its chunk c < p those of chunk ``rank`` and c >= p those of
    2p - 1 - rank: the stage's re-runs of that chunk, n_rank R, spread over c's own passes,

        unit_c = n_leg R_leg / n_c,        the step's re-runs = n_rank R_0 + n_(2p-1-rank) R_1 on every rank,

    so each split backward takes two units and each whole one one, and the stage's own m backwards of chunk c
    re-run n_c R_c = m r_c R_c, the price of the step time (cost/stages.py). Empty and 0 without recomputation."""
    if not any(rerun_s):
        return (), 0.0
    splits = split_backwards(schedule, pp=pp, m=m)
    passes = [m + (splits[c] if c > 0 else 0) for c in range(2 * pp)]
    leg_s = (passes[rank] * rerun_s[0], passes[2 * pp - 1 - rank] * rerun_s[1])
    return tuple(leg_s[c >= pp] / passes[c] for c in range(2 * pp)), leg_s[0] + leg_s[1]


def looped_rerun_units(
    *, pp: int, virtual_stages: int, m: int, rerun_s: dict[int, float]
) -> tuple[tuple[float, ...], float]:
    """(per chunk c of interleaved_zb's p v, the seconds of one re-run in each of its backward passes in the replay,
    cost/pp/looped_replay.py; the step's re-run seconds on every rank), where every rank runs the work of the stage k
    whose chunks k + j p re-run once in ``rerun_s[k + j p]`` seconds (StageTotals.chunk_rerun_s).

    As :func:`v_rerun_units`: chunk c's m backwards run n_c passes, m for chunk 0 and 2 m for the rest (B and W),
    and rank r's chunk r + j p carries the stage's re-runs of its chunk k + j p spread over its own passes,

        unit_c = n_(k + j p) R_(k + j p) / n_c,       the step's re-runs = sum over j of n_(k + j p) R_(k + j p),

    so each rank's work is the stage's m T and stage k's chunk c re-runs m r_c R_c (:func:`forward_reruns`).
    Empty and 0 without recomputation."""
    if not any(rerun_s.values()):
        return (), 0.0
    stage, chunks = stage_of_chunk(min(rerun_s), pp=pp), pp * virtual_stages
    passes = [m if c == 0 else 2 * m for c in range(chunks)]
    own = chunks_of_stage(stage, pp=pp, virtual_stages=virtual_stages)  # its chunk on each leg j
    legs = [passes[c] * rerun_s.get(c, 0.0) for c in own]
    return tuple(legs[local_chunk(c, pp=pp)] / passes[c] for c in range(chunks)), sum(legs)


def plan_forward_reruns(plan: Any, chunk: int) -> float:
    """:func:`forward_reruns` of ``plan``'s schedule, pp and micro-batches (of :func:`chunk_forward_reruns`' memo
    where ``chunk`` is one of the plan's chunks)."""
    reruns = chunk_forward_reruns(plan)
    if 0 <= chunk < len(reruns):
        return reruns[chunk]
    return forward_reruns(schedule=plan.schedule, pp=plan.pp, num_microbatches=plan.num_microbatches, chunk=chunk)


def chunk_forward_reruns(plan: Any) -> tuple[float, ...]:
    """:func:`forward_reruns` of each of ``plan``'s pp * v chunks, memoised on what it reads (schedule, pp, v, m):
    the search asks it of every plan it bounds, each chunk of each (a million calls on GPT-1T)."""
    return _chunk_reruns(plan.schedule, plan.pp, plan.virtual_stages, plan.num_microbatches)


@stored(maxsize=None)  # one per (schedule, pp, v, m) a search meets
def _chunk_reruns(schedule: str, pp: int, virtual_stages: int, m: int) -> tuple[float, ...]:
    kw = dict(schedule=schedule, pp=pp, num_microbatches=m)
    return tuple(forward_reruns(**kw, chunk=c) for c in range(pp * virtual_stages))
