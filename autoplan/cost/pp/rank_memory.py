"""What one pipeline rank holds as it runs torch's order of its actions (docs/cost-model.md, "Pipeline memory").

Rank r runs chunks c_1 < ... < c_v (types/layout.py) in the order torch builds (cost/pp/v_orders.py for the
V schedules, cost/pp/looped_orders.py for interleaved_1f1b and interleaved_zb). After each action the state is

    h_j  = micro-batches of chunk c_j whose F ran and whose W (or whole backward BW) did not: its activations
    k_j  = those of them whose B ran: the output gradients torch's stage_backward_input keeps to W (chunk 0
           keeps none: torch skips the first stage's B and runs its whole backward as W)
    sent = outputs of chunks whose W or BW ran (all chunks but the last, the loss), and grads = input gradients
           of chunks whose B or BW ran (all but chunk 0): torch's ``_PipelineScheduleRuntime`` waits its sends
           only after the step's last action (torch 2.13 schedules.py ``send_ops``), and each send's work
           holds its tensor until then; the V's turn keeps them in the neighbour's per-micro-batch receive
           slot (stage.py ``set_local_fwd_input``); each with its receive slots (cost/pp/receive_slots.py)

and loss = 1 while the last chunk's backward runs (the state before its B or BW), 0 after each action. With
S_j, K_j chunk c_j's activations and kept gradients of one micro-batch, D one boundary and D_g its gradients, the
larger of the rank's input's and output's (cost/stages.py ``held_boundary_bytes``, receive_slots.py) and L the
loss's gradients (cost/stages.py ``loss_grad_bytes``, alive only in that backward),

    peak = max over states of  sum_j (h_j S_j + k_j K_j) + sent D + grads D_g + loss L

Only the states no other exceeds in every count can be that maximum, whatever S, K, D, D_g weigh: they are kept
(:func:`rank_states`, once per schedule, p, v, m and rank); a price reads them from the rows (:func:`peak_state`).
Each chunk weighs its own bytes: stage 0 of a V (the embedding's chunk beside the head's and loss's) as it holds.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from typing import NamedTuple

import numpy as np

from autoplan.cost.pp.looped_orders import looped_order
from autoplan.cost.pp.order_states import distinct_rows, merge_sent, order_halves, order_states, ranks_states
from autoplan.cost.pp.receive_slots import slot_changes
from autoplan.cost.pp.v_orders import Action, v_order
from autoplan.cost.stored import stored
from autoplan.types.layout import chunks_of_stage
from autoplan.types.schedules import V_SCHEDULES

State = tuple[int, ...]  # (h per chunk group, k per chunk group, sent, grads, loss): chunk_groups


def rank_order(schedule: str, *, pp: int, virtual_stages: int, m: int, rank: int) -> tuple[Action, ...]:
    """The actions ``rank`` runs under ``schedule``, in torch's order (module docstring)."""
    if schedule in V_SCHEDULES:
        return v_order(schedule, pp=pp, m=m)[rank]
    return looped_order(schedule, pp=pp, virtual_stages=virtual_stages, m=m)[rank]


@lru_cache(maxsize=None)  # a search meets a few thousand (schedule, pp, v, m, rank): a bound thrashed
def rank_states(
    *, schedule: str, pp: int, virtual_stages: int, m: int, rank: int, merged: bool = False
) -> tuple[State, ...]:
    """The states of ``rank`` no other exceeds in every count (module docstring), memoised, its chunks counted
    in :func:`chunk_groups`: the frontier of :func:`rank_rows` (:func:`rank_states_walk` is the walk, one action
    at a time, that tests/unit/cost/test_rank_states_fast.py holds it to). ``merged``: of the rows with sent and
    grads summed into one count (order_states.py ``merge_sent``), for a boundary whose every tensor has a
    gradient (D_g = D, one weight for both), as the states were before gradients were counted apart: fewer rows
    into the frontier, and the same greatest bytes."""
    rows = rank_rows(schedule=schedule, pp=pp, virtual_stages=virtual_stages, m=m, rank=rank)
    return frontier(merge_sent(rows) if merged else rows)


def rank_rows(*, schedule: str, pp: int, virtual_stages: int, m: int, rank: int) -> np.ndarray:
    """States of ``rank``'s walk, as rows, among which are all of :func:`rank_states` and each of the others
    is at most one of them (cost/pp/order_states.py computes them at once); memoised and read-only: the search's
    floors read them first (:func:`rank_floors`), and a price's :func:`rank_states` of the same rank after."""
    return _schedule_rows(schedule, pp, virtual_stages, m)[rank]


#: (ranks x halves x counts) int64 cells one pass of order_states.py ``ranks_states`` holds at most: 64 MiB
RANKS_CELLS = 1 << 23


@lru_cache(maxsize=None)  # GPT-1T on 3,072 A100s meets ~250, every rank of each (~5,700 ranks, 80 MB)
def _schedule_rows(schedule: str, pp: int, virtual_stages: int, m: int) -> tuple[np.ndarray, ...]:
    """:func:`_rows` of every rank, read-only: the search asks each rank of a schedule it meets (its floors read
    every stage), so their rows are made together (order_states.py ``ranks_states``), ranks with as many halves
    at once, RANKS_CELLS at most, each rank alone where that holds one rank or its groups differ in number."""
    inputs = [_rank_inputs(schedule, pp, virtual_stages, m, rank) for rank in range(pp)]
    width = 2 * len(group_sizes(schedule=schedule, pp=pp, virtual_stages=virtual_stages, rank=0)) + 3  # counts
    last, rows, start = pp * virtual_stages - 1, [], 0
    while start < pp:
        end, count = start + 1, len(inputs[start][0])
        while end < pp and len(inputs[end][0]) == count and (end + 1 - start) * count * width <= RANKS_CELLS:
            end += 1
        block, together = inputs[start:end], None
        if end - start > 1:
            kinds, chunks, group_of = (np.stack([x[i] for x in block]) for i in range(3))
            together = ranks_states(kinds, chunks, group_of=group_of, last=last, slots=[x[3] for x in block])
        rows += together or [order_states(*x[:2], group_of=x[2], last=last, slots=x[3]) for x in block]
        start = end
    for one in rows:
        one.setflags(write=False)
    return tuple(rows)


def _rank_inputs(schedule: str, pp: int, virtual_stages: int, m: int, rank: int) -> tuple:
    """(kinds, chunks, each chunk's group, receive slots) of ``rank``'s order: what order_states.py reads."""
    where = dict(schedule=schedule, pp=pp, virtual_stages=virtual_stages, rank=rank)
    kinds, chunks = order_halves(m=m, **where)
    group_of = np.zeros(pp * virtual_stages, dtype=np.int64)
    for chunk, group in chunk_groups(**where).items():
        group_of[chunk] = group
    return kinds, chunks, group_of, slot_changes(m=m, **where)


def _rows(schedule: str, pp: int, virtual_stages: int, m: int, rank: int) -> np.ndarray:
    """``rank``'s rows alone (order_states.py ``order_states``): what :func:`_schedule_rows` makes of each rank."""
    kinds, chunks, group_of, slots = _rank_inputs(schedule, pp, virtual_stages, m, rank)
    return order_states(kinds, chunks, group_of=group_of, last=pp * virtual_stages - 1, slots=slots)


class RankFloors(NamedTuple):
    """What the search's memory floors and the in-flight counts read of one rank's states (:func:`rank_floors`)."""

    held_floor: tuple[float, float]  # cost/memory/replayed.py held_floor
    most_sent: tuple[int, int]  # cost/memory/replayed.py most_sent
    held_at_peak: tuple[int, int]  # cost/pp/replay.py held_at_peak
    sent_at_held: tuple[int, int] = (0, 0)  # cost/memory/replayed.py sent_at_held_floor


@stored(maxsize=None)  # one per (schedule, pp, v, m, rank) a search bounds: a few thousand small tuples
def rank_floors(*, schedule: str, pp: int, virtual_stages: int, m: int, rank: int) -> RankFloors:
    """:class:`RankFloors` of ``rank``, from :func:`rank_rows` without the frontier (:func:`rank_states`), which the
    search then builds only for the ranks of the plans it prices. Each is a greatest over the frontier that every
    row at most a frontier state cannot exceed, so it is the rows' own (tests/unit/cost/test_rank_floors.py holds
    them to the frontier's):

    - held_floor: at the state with the most chunks held, then kept (of those, the first in the frontier's order,
      the least (held, kept) in tuple order: a row at most a state with the same sums has its held and kept), the
      fewest per chunk of any group, held and kept;
    - most_sent: the most boundary tensors and gradients of any state together, and the most boundary tensors;
    - held_at_peak: the (held, kept) of the greatest (held, kept, sent + grads), all chunks together;
    - sent_at_held: the greatest (sent + grads, sent) of a row with held_floor's counts (a row, so at most a state:
      its bytes, each weight at least its floor, bound the peak with held_floor's)."""
    where = dict(schedule=schedule, pp=pp, virtual_stages=virtual_stages, rank=rank)
    rows, sizes = rank_rows(m=m, **where), group_sizes(**where)
    g = len(sizes)
    held, kept, forward = rows[:, :g].sum(axis=1), rows[:, g : 2 * g].sum(axis=1), rows[:, 2 * g]
    sent = forward + rows[:, 2 * g + 1]
    top = held == held.max()
    top &= kept == kept[top].max()
    top = np.flatnonzero(top)
    counts = rows[top][:, : 2 * g]
    most = counts[np.lexsort(counts.T[::-1])[0]]  # the least (held, kept) in tuple order
    listed = most.tolist()
    floor = (min(n / size for n, size in zip(listed[:g], sizes)), min(n / size for n, size in zip(listed[g:], sizes)))
    peak = int(np.lexsort((sent, kept, held))[-1])
    same = top[(counts == most).all(axis=1)]
    at = same[np.lexsort((forward[same], sent[same]))[-1]]
    return RankFloors(
        floor,
        (int(sent.max()), int(forward.max())),
        (int(held[peak]), int(kept[peak])),
        (int(sent[at]), int(forward[at])),
    )


def rank_states_walk(*, schedule: str, pp: int, virtual_stages: int, m: int, rank: int) -> tuple[State, ...]:
    """:func:`rank_states` by walking ``rank``'s order one action at a time (the reference). An F&B pair counts
    its forward before its backward frees, as torch runs them."""
    group = chunk_groups(schedule=schedule, pp=pp, virtual_stages=virtual_stages, rank=rank)
    last, size = pp * virtual_stages - 1, max(group.values()) + 1
    (sent, grads), slots = slot_changes(schedule=schedule, pp=pp, virtual_stages=virtual_stages, m=m, rank=rank)
    held, kept = [0] * size, [0] * size
    most: dict[tuple, int] = {}  # the most tensors sent at each (h, k, grads, loss)
    for action in rank_order(schedule, pp=pp, virtual_stages=virtual_stages, m=m, rank=rank):
        halves = [("F", action[1]), ("BW", action[3])] if action[0] == "FB" else [(action[0], action[1])]
        for kind, chunk in halves:
            if chunk == last and kind in ("B", "BW"):  # the loss's backward runs on the state before it
                key = (*held, *kept, grads, 1)
                most[key] = max(most.get(key, 0), sent)
            j = group[chunk]
            held[j] += _HELD[kind]
            kept[j] += _KEPT[kind] if chunk > 0 else 0
            forward, back = slots.get((kind, chunk), (0, 0))  # the receive slots, the outputs from F (receive_slots.py)
            sent += (kind in ("W", "BW") and chunk < last) + forward
            grads += (kind in ("B", "BW") and chunk > 0) + back
            key = (*held, *kept, grads, 0)
            most[key] = max(most.get(key, 0), sent)
    return frontier([(*key[:-2], n, *key[-2:]) for key, n in most.items()])


_HELD = {"F": 1, "B": 0, "W": -1, "BW": -1}  # a chunk's activations: made by F, freed by W or the whole backward
_KEPT = {"F": 0, "B": 1, "W": -1, "BW": 0}  # its output gradients: kept by B until W


@stored(maxsize=4096)
def chunk_groups(*, schedule: str, pp: int, virtual_stages: int, rank: int) -> dict[int, int]:
    """Each chunk of ``rank``'s group in its states: the first (0), the last (the largest group) and, with v > 2,
    the chunks between them together (1), whose activations the price takes at their mean. Only the first and
    the last chunk run the nodes outside the blocks, so the middle ones weigh the same under an even partition;
    2 v + 2 counts per state would make the frontier's cost grow with v."""
    chunks = sorted(chunks_of_stage(rank, pp=pp, virtual_stages=virtual_stages, v_shape=schedule in V_SCHEDULES))
    return {c: 0 if j == 0 else (min(2, len(chunks) - 1) if j == len(chunks) - 1 else 1) for j, c in enumerate(chunks)}


@stored(maxsize=4096)
def group_sizes(*, schedule: str, pp: int, virtual_stages: int, rank: int) -> tuple[int, ...]:
    """How many chunks each group of :func:`chunk_groups` holds."""
    groups = list(chunk_groups(schedule=schedule, pp=pp, virtual_stages=virtual_stages, rank=rank).values())
    return tuple(groups.count(g) for g in range(max(groups) + 1))


def frontier(states: Sequence[State] | np.ndarray) -> tuple[State, ...]:
    """The distinct ``states`` no other is at least in every count, in sorted order. Up to ``_PAIRS_AT_MOST``
    distinct states each is tested against all, ``_BLOCK`` at a time. More are read by falling sum (a distinct
    state at least another in every count has the larger sum), ``_BLOCK`` at a time: a state is kept unless one
    already kept, or a survivor of its own block, is at least it (one kept earlier and exceeded is exceeded by a
    kept one too). That costs states x kept, not states squared: a long step's 10^5 states keep a few."""
    rows = distinct_rows(np.asarray(states, dtype=np.int64).reshape(len(states), -1))  # sorted, as tuples sort
    kept = _kept_by_pairs(rows) if len(rows) <= _PAIRS_AT_MOST else _kept_by_sum(rows)
    return tuple(map(tuple, rows[kept].tolist()))


def _kept_by_pairs(rows: np.ndarray) -> np.ndarray:
    """:func:`frontier`'s mask, each row tested against every other, one count at a time (each test a long numpy
    loop over pairs, not a short one over the counts)."""
    counts = [np.ascontiguousarray(rows[:, c]) for c in range(rows.shape[1])]
    kept = np.empty(len(rows), dtype=bool)
    for start in range(0, len(rows), _BLOCK):
        end = min(start + _BLOCK, len(rows))
        within = counts[0][start:end, None] <= counts[0][None, :]  # [i, j]: row start + i at most row j
        for count in counts[1:]:
            within &= count[start:end, None] <= count[None, :]
        within[np.arange(end - start), np.arange(start, end)] = False  # not itself
        kept[start:end] = ~within.any(axis=1)
    return kept


def _kept_by_sum(rows: np.ndarray) -> np.ndarray:
    """:func:`frontier`'s mask, the rows read by falling sum against those kept."""
    falling = np.argsort(-rows.sum(axis=1), kind="stable")
    kept, found = np.zeros(len(rows), dtype=bool), rows[:0]
    for start in range(0, len(rows), _BLOCK):
        block = falling[start : start + _BLOCK]
        block = block[~_exceeded(rows[block], found)]
        within = _at_most(rows[block], rows[block])
        within[np.arange(len(block)), np.arange(len(block))] = False  # not itself
        block = block[~within.any(axis=1)]
        kept[block], found = True, np.concatenate([found, rows[block]])
    return kept


def _at_most(rows: np.ndarray, others: np.ndarray) -> np.ndarray:
    """[i, j]: row i at most row j of ``others`` in every count."""
    mine, theirs = np.ascontiguousarray(rows.T), np.ascontiguousarray(others.T)  # one count a contiguous row
    within = np.ones((len(rows), len(others)), dtype=bool)
    for count, other in zip(mine, theirs):
        within &= count[:, None] <= other[None, :]
    return within


def _exceeded(rows: np.ndarray, kept: np.ndarray) -> np.ndarray:
    """Whether each of ``rows`` is at most one of ``kept`` (distinct from it: none of ``rows`` is kept yet)."""
    return _at_most(rows, kept).any(axis=1) if len(kept) else np.zeros(len(rows), dtype=bool)


_BLOCK = 256  # states tested at once: a block's test holds _BLOCK * (states or kept + _BLOCK) booleans
_PAIRS_AT_MOST = 2048  # distinct states tested all against all: fewer numpy calls where few are many


def peak_state(states: Sequence[State] | np.ndarray, *, saved_bytes: Sequence[float], kept_bytes: Sequence[float],
               boundary_bytes: float, grad_bytes: float, loss_bytes: float,
               matrix: np.ndarray | None = None) -> State:  # fmt: skip
    """The state of the frontier of ``states`` holding the most bytes (the first of them in sorted order where
    several do), with ``saved_bytes`` and ``kept_bytes`` per chunk group (in the order of :func:`chunk_groups`),
    ``boundary_bytes`` one boundary handed on, ``grad_bytes`` its gradients (D_g) and ``loss_bytes`` the loss's
    gradients (module docstring); ``matrix``: ``states`` as floats, where the caller holds them (:func:`row_matrix`);
    merged states (order_states.py ``merge_sent``, one count fewer) weigh their merged count at ``boundary_bytes``.
    ``states`` may be the frontier or any rows among which it lies (:func:`rank_rows`): every weight is >= 0, so a
    row at most another holds at most its bytes, and the frontier's states holding the most are the rows holding
    the most that no other of them exceeds (their frontier, a few rows: no frontier of all the rows is built)."""
    weights = [*saved_bytes, *kept_bytes, boundary_bytes, grad_bytes, loss_bytes]
    rows = np.asarray(states, dtype=np.float64) if matrix is None else matrix
    if rows.shape[1] == len(weights) - 1:  # merged states (order_states.py merge_sent): one count at D = D_g
        del weights[len(saved_bytes) + len(kept_bytes) + 1]
    values = rows @ np.asarray(weights, dtype=np.float64)
    tied = np.flatnonzero(values == values.max())
    if len(tied) == 1:
        return tuple(np.asarray(states[int(tied[0])]).tolist())
    most = np.asarray(states)[tied]
    within = _at_most(most, most)
    within[np.arange(len(most)), np.arange(len(most))] = False  # not itself
    kept = most[~within.any(axis=1)]
    return tuple(kept[np.lexsort(kept.T[::-1])[0]].tolist())  # the least in sorted order


@lru_cache(maxsize=None)  # one per rank a search prices (and merged)
def row_matrix(
    *, schedule: str, pp: int, virtual_stages: int, m: int, rank: int, merged: bool = False
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`rank_rows` (``merged``: order_states.py ``merge_sent`` of them), and the same rows as floats, both
    read-only, memoised: a search weighs the same rows under many plans' bytes (:func:`peak_state`)."""
    rows = rank_rows(schedule=schedule, pp=pp, virtual_stages=virtual_stages, m=m, rank=rank)
    rows = merge_sent(rows) if merged else rows
    floats = rows.astype(np.float64)
    rows.setflags(write=False)
    floats.setflags(write=False)
    return rows, floats
