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

The split backwards of a V schedule are counted in each rank's halves (v_orders.py ``v_halves``: an F&B pair's
backward is whole, as in ``v_order``), built as repeated patterns in O(p) numpy steps per rank, not O(m) actions:
a search meets a hundred (schedule, pp, m). A plan's re-runs per chunk read its schedule, pp, virtual stages and
micro-batches alone, and are kept per those.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import numpy as np

from autoplan.cost.pp.v_orders import v_halves
from autoplan.types.schedules import SPLIT_BACKWARD, V_SCHEDULES


def forward_reruns(*, schedule: str, pp: int, num_microbatches: int, chunk: int) -> float:
    """Re-runs of a recomputed block of chunk ``chunk`` per micro-batch, averaged over the step (module docstring):
    1 + the share of its backwards that are split, counted in the V schedules' orders (cost/pp/v_orders.py)."""
    if chunk == 0 or schedule not in SPLIT_BACKWARD:
        return 1.0
    if schedule not in V_SCHEDULES:
        return 2.0
    return 1.0 + split_backwards(schedule, pp=pp, m=num_microbatches)[chunk] / num_microbatches


@lru_cache(maxsize=None)  # one per (schedule, pp, m) a search meets
def split_backwards(schedule: str, *, pp: int, m: int) -> tuple[int, ...]:
    """Per chunk of a V ``schedule``, how many of its m backwards run as B then W (v_order's "B" actions; "BW"
    and an F&B pair's backward run whole), counted in each rank's halves (kind code 1: B; module docstring)."""
    counts = np.zeros(2 * pp, dtype=np.int64)
    for rank in range(pp):
        kinds, chunks = v_halves(schedule, pp=pp, m=m, rank=rank)
        counts += np.bincount(chunks[kinds == 1], minlength=2 * pp)
    return tuple(int(c) for c in counts)


def plan_forward_reruns(plan: Any, chunk: int) -> float:
    """:func:`forward_reruns` of ``plan``'s schedule, pp and micro-batches."""
    return forward_reruns(schedule=plan.schedule, pp=plan.pp, num_microbatches=plan.num_microbatches, chunk=chunk)


def chunk_forward_reruns(plan: Any) -> tuple[float, ...]:
    """:func:`plan_forward_reruns` of each of ``plan``'s pp * v chunks, kept per the fields they read."""
    return _chunk_reruns(plan.schedule, plan.pp, plan.virtual_stages, plan.num_microbatches)


@lru_cache(maxsize=None)  # a few hundred (schedule, pp, v, m) a search meets, asked per plan and bound
def _chunk_reruns(schedule: str, pp: int, virtual_stages: int, m: int) -> tuple[float, ...]:
    chunks = range(pp * virtual_stages)
    return tuple(forward_reruns(schedule=schedule, pp=pp, num_microbatches=m, chunk=c) for c in chunks)
