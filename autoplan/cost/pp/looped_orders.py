"""Each rank's action order under torch's looping interleaved schedules, as torch 2.13 builds it
(``_get_1f1b_rank_ops`` in torch/distributed/pipelining/schedules.py; docs/cost-model.md, "Pipeline memory").

Rank r of p runs chunks r, r + p, ..., r + (v - 1) p (types/layout.py). With m micro-batches in
``max(1, m // p)`` rounds of n = m / rounds each, an action is (kind, chunk, micro-batch) as in
:mod:`autoplan.cost.pp.v_orders`:

    warm-up  = min((v - 1) n + k (p - 1 - r), v m)   forwards (k = 2: interleaved_1f1b, 1: interleaved_zb)
    forward chunk of step t  = ((t // n) mod v) p + r
    backward chunk of step t = (v - 1 - ((t - warm-up) // n) mod v) p + r

then v m - warm-up steps of (F, backward) and warm-up steps of a backward alone. interleaved_1f1b runs each
backward whole (BW); interleaved_zb runs B, and from its (r + 1)-th steady step on one W after each B, oldest
first, the Ws left after the last B. torch's bubbles (``None``, ``_add_bubbles_to_actions``) move no action.
tests/unit/cost/test_rank_memory.py checks both against torch's own ``pipeline_order``; :func:`looped_halves`
builds one rank's kinds and chunks from the same formulas as arrays, at once (cost/pp/order_states.py).
"""

from __future__ import annotations

import numpy as np

from autoplan.cost.pp.v_orders import Action
from autoplan.cost.stored import stored

KINDS = ("F", "B", "W", "BW")  # an action's kind, by its code in the arrays of looped_halves


@stored(maxsize=256)
def looped_order(schedule: str, *, pp: int, virtual_stages: int, m: int) -> tuple[tuple[Action, ...], ...]:
    """Each rank's actions under ``schedule`` ("interleaved_1f1b" or "interleaved_zb"), memoised."""
    return tuple(tuple(_rank(schedule, rank, pp=pp, v=virtual_stages, m=m)) for rank in range(pp))


def _rank(schedule: str, rank: int, *, pp: int, v: int, m: int) -> list[Action]:
    """The order of ``rank`` (module docstring)."""
    zero_bubble = schedule == "interleaved_zb"
    per_round = m // max(1, m // pp)
    warmup = min((v - 1) * per_round + (1 if zero_bubble else 2) * (pp - 1 - rank), v * m)
    count: dict[tuple[str, int], int] = {}
    out: list[Action] = []

    def run(kind: str, chunk: int) -> None:
        out.append((kind, chunk, count.get((kind, chunk), 0)))
        count[kind, chunk] = count.get((kind, chunk), 0) + 1

    def forward_chunk(step: int) -> int:
        return ((step // per_round) % v) * pp + rank

    def backward_chunk(step: int) -> int:
        return (v - 1 - ((step - warmup) // per_round) % v) * pp + rank

    backwards: list[int] = []  # the chunk of each B run, in order: their Ws run oldest first
    for step in range(v * m + warmup):
        if step < v * m:
            run("F", forward_chunk(step))
        if step < warmup:
            continue
        run("B" if zero_bubble else "BW", backward_chunk(step))
        backwards.append(backward_chunk(step))
        if zero_bubble and step - warmup >= rank:
            run("W", backwards[_weights_run(count)])
    while zero_bubble and _weights_run(count) < len(backwards):
        run("W", backwards[_weights_run(count)])
    return out


def _weights_run(count: dict[tuple[str, int], int]) -> int:
    return sum(n for (kind, _), n in count.items() if kind == "W")


def looped_halves(schedule: str, *, pp: int, virtual_stages: int, m: int, rank: int) -> tuple[np.ndarray, np.ndarray]:
    """The kinds (codes of ``KINDS``) and chunks of ``rank``'s actions in :func:`looped_order`'s order: step t
    runs its F, then its backward, then (interleaved_zb) the W of the backward ``rank`` steps before it; the Ws
    left run after the last step (module docstring)."""
    zero_bubble, v = schedule == "interleaved_zb", virtual_stages
    per_round, total = m // max(1, m // pp), v * m
    warmup = min((v - 1) * per_round + (1 if zero_bubble else 2) * (pp - 1 - rank), total)
    step = np.arange(total + warmup)
    steady = step - warmup
    backward = (v - 1 - (np.maximum(steady, 0) // per_round) % v) * pp + rank
    kinds = np.full((len(step), 3), -1)
    chunks = np.zeros((len(step), 3), dtype=np.int64)
    kinds[:total, 0], chunks[:, 0] = 0, ((step // per_round) % v) * pp + rank
    kinds[steady >= 0, 1], chunks[:, 1] = (1 if zero_bubble else 3), backward
    if zero_bubble:
        weights = steady >= rank
        kinds[weights, 2], chunks[weights, 2] = 2, backward[step[weights] - rank]
    run = kinds >= 0  # row-major: each step's F, backward and W in that order
    tail = backward[warmup + max(0, total - rank) :] if zero_bubble else backward[:0]
    return np.concatenate([kinds[run], np.full(len(tail), 2)]), np.concatenate([chunks[run], tail])
