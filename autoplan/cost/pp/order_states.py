"""One rank's states as it runs its order, as arrays (docs/cost-model.md, "Pipeline memory"): the candidates of
cost/pp/rank_memory.py's ``rank_states``, in one pass of numpy rather than one Python step per action.

An order is a sequence of halves (kind, chunk) (DualPipeV's F&B pair is its F, then its whole backward BW).
With g(c) the group of chunk c (rank_memory.py ``chunk_groups``) and ``last`` the loss's chunk, half i adds

    held[g(c)] += 1 (F), -1 (W, BW)        kept[g(c)] += 1 (B), -1 (W), where c > 0
    sent += [kind in (W, BW) and c < last] + forward slot change      (boundary tensors, D each)
    grads += [kind in (B, BW) and c > 0] + gradient slot change       (their gradients, D_g each; receive_slots.py)

so the state after half i is the cumulative sum of the deltas up to i, and the loss's backward (a B or BW of
``last``) runs on the row before it. Two rules drop rows that cannot be on the frontier (a row at most another
is never kept) before it is computed:

    a row followed by a half that only adds (F, B) is at most the next row;
    of the rows with the same (held, kept, grads, loss), all but the most sent are at most it.
"""

from __future__ import annotations

import numpy as np

from autoplan.cost.pp.looped_orders import KINDS, looped_halves
from autoplan.cost.pp.v_orders import v_halves
from autoplan.types.schedules import V_SCHEDULES

_HELD = np.array([1, 0, -1, -1])  # by kind code (KINDS): a chunk's activations, made by F, freed by W or BW
_KEPT = np.array([0, 1, -1, 0])  # its output gradients: kept by B until W
_CODE = {kind: code for code, kind in enumerate(KINDS)}


def order_halves(schedule: str, *, pp: int, virtual_stages: int, m: int, rank: int) -> tuple[np.ndarray, np.ndarray]:
    """The kinds (codes of looped_orders.py ``KINDS``) and chunks of the halves ``rank`` runs, in torch's order."""
    if schedule not in V_SCHEDULES:
        return looped_halves(schedule, pp=pp, virtual_stages=virtual_stages, m=m, rank=rank)
    return v_halves(schedule, pp=pp, m=m, rank=rank)


def order_states(
    kinds: np.ndarray,
    chunks: np.ndarray,
    *,
    group_of: np.ndarray,
    last: int,
    slots: tuple[tuple[int, int], dict] = ((0, 0), {}),
) -> np.ndarray:
    """Rows (held per group, kept per group, sent, grads, loss) of the states after each half and before the loss's
    backward, less the rows the module docstring's two rules drop; ``group_of[c]`` is chunk c's group, ``slots``
    the receive slots (forward, gradient) at the step's start and their change after a (kind, chunk) half
    (receive_slots.py)."""
    groups, count = int(group_of.max()) + 1, len(kinds)
    group, sent = group_of[chunks], 2 * groups
    deltas = np.zeros((count, sent + 3), dtype=np.int64)
    deltas[np.arange(count), group] = _HELD[kinds]
    deltas[np.arange(count), groups + group] = _KEPT[kinds] * (chunks > 0)
    backward = (kinds == 1) | (kinds == 3)
    weight = (kinds == 2) | (kinds == 3)
    deltas[:, sent] = weight & (chunks < last)
    deltas[:, sent + 1] = backward & (chunks > 0)
    for (kind, chunk), change in slots[1].items():
        deltas[(kinds == _CODE[kind]) & (chunks == chunk), sent : sent + 2] += change
    start = np.zeros(sent + 3, dtype=np.int64)
    start[sent : sent + 2] = slots[0]
    after = start + np.cumsum(deltas, axis=0)
    falls = np.ones(count, dtype=bool)
    falls[:-1] = (deltas[1:] < 0).any(axis=1)
    at_loss = np.flatnonzero(backward & (chunks == last))
    before_loss = np.where((at_loss > 0)[:, None], after[np.maximum(at_loss - 1, 0)], start)
    before_loss[:, -1] = 1
    return _most_sent(np.concatenate([after[falls], before_loss]), sent=sent)


def ranks_states(
    kinds: np.ndarray, chunks: np.ndarray, *, group_of: np.ndarray, last: int, slots: list
) -> list[np.ndarray] | None:
    """:func:`order_states` of every rank of one schedule at once, as numpy arrays of shape (ranks, halves): the
    search asks each rank of a (schedule, p, v, m) it meets (rank_memory.py ``rank_rows``), and one pass over all
    of them makes each rank's numpy calls once. Each rank's rows are :func:`order_states`' own, in its order:
    ``_most_sent`` reads them beside the rank's index as a leading count, so they sort by rank first, and a run of
    equal counts never spans two ranks. ``group_of[r, c]``: chunk c's group on rank r; ``slots[r]``: rank r's
    receive slots. None where the ranks' groups differ in number (each then by :func:`order_states`)."""
    ranks, count = kinds.shape
    groups = {int(g.max()) + 1 for g in group_of}
    if len(groups) != 1:
        return None
    groups = groups.pop()
    group, sent = np.take_along_axis(group_of, chunks, axis=1), 2 * groups
    deltas = np.zeros((ranks, count, sent + 3), dtype=np.int64)
    held, kept = _HELD[kinds], _KEPT[kinds] * (chunks > 0)
    for g in range(groups):  # a half changes its own group's counts only
        mine = group == g
        deltas[:, :, g], deltas[:, :, groups + g] = held * mine, kept * mine
    backward = (kinds == 1) | (kinds == 3)
    weight = (kinds == 2) | (kinds == 3)
    deltas[:, :, sent] = weight & (chunks < last)
    deltas[:, :, sent + 1] = backward & (chunks > 0)
    for r, (_start, changes) in enumerate(slots):
        for (kind, chunk), change in changes.items():
            deltas[r][(kinds[r] == _CODE[kind]) & (chunks[r] == chunk), sent : sent + 2] += change
    start = np.zeros((ranks, sent + 3), dtype=np.int64)
    start[:, sent : sent + 2] = [first for first, _changes in slots]
    after = np.cumsum(deltas, axis=1)
    after += start[:, None, :]
    falls = np.ones((ranks, count), dtype=bool)  # a half's nonzero counts: its group's held and kept, sent, grads
    falls[:, :-1] = ((held < 0) | (kept < 0) | (deltas[:, :, sent] < 0) | (deltas[:, :, sent + 1] < 0))[:, 1:]
    loss_rank, at_loss = np.nonzero(backward & (chunks == last))
    before_loss = np.where((at_loss > 0)[:, None], after[loss_rank, np.maximum(at_loss - 1, 0)], start[loss_rank])
    before_loss[:, -1] = 1
    fall_rank, fall_at = np.nonzero(falls)
    rows = np.concatenate([after[fall_rank, fall_at], before_loss])
    owner = np.concatenate([fall_rank, loss_rank])[:, None]
    kept = _most_sent(np.concatenate([owner, rows], axis=1), sent=sent + 1)
    edges = np.searchsorted(kept[:, 0], np.arange(ranks + 1))
    return [np.ascontiguousarray(kept[edges[r] : edges[r + 1], 1:]) for r in range(ranks)]


def merge_sent(rows: np.ndarray) -> np.ndarray:
    """Rows (held, kept, sent, grads, loss) as (held, kept, sent + grads, loss), for a boundary whose every tensor
    has a gradient (D_g = D, one weight for both), less those the second rule drops once merged (of the rows with
    the same (held, kept, loss), all but the most sent + grads). A row at most another stays at most it once
    merged, so the frontier of these is the frontier of the merged frontier, each row weighing its merged bytes."""
    sent = rows.shape[1] - 3
    merged = np.concatenate([rows[:, :sent], rows[:, sent : sent + 1] + rows[:, sent + 1 : -1], rows[:, -1:]], 1)
    return _most_sent(merged, sent=sent)


def _most_sent(rows: np.ndarray, *, sent: int) -> np.ndarray:
    """Of the rows with equal counts but ``sent``, the one with the most sent, in the order of their counts: read as
    one number each (:func:`_packed`, sent last, its least significant place), sorted, the last of each run of equal
    counts (the number's quotient by sent's radix)."""
    order = [*range(sent), *range(sent + 1, rows.shape[1]), sent]  # sent last: sorting puts it last in its counts
    rows = rows[:, order]
    if (packed := _packed(rows)) is None:
        rows = np.unique(rows, axis=0)
        last_of_counts = np.ones(len(rows), dtype=bool)
        last_of_counts[:-1] = (rows[1:, :-1] != rows[:-1, :-1]).any(axis=1)
        return rows[last_of_counts][:, np.argsort(order)]
    numbers, radix = packed
    rising = np.argsort(numbers, kind="stable")
    counts = numbers[rising] // radix[-1]
    last_of_counts = np.ones(len(rows), dtype=bool)
    last_of_counts[:-1] = counts[1:] != counts[:-1]
    return rows[rising[last_of_counts]][:, np.argsort(order)]


def distinct_rows(rows: np.ndarray) -> np.ndarray:
    """The distinct rows of ``rows`` in lexicographic order, as ``np.unique(rows, axis=0)`` returns them, by their
    numbers (:func:`_packed`) where they have them."""
    if (packed := _packed(rows)) is None:
        return np.unique(rows, axis=0)
    _, first = np.unique(packed[0], return_index=True)
    return rows[first]


def _packed(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """Each row read as one number in the mixed radix of its columns' largest counts plus one, which sorts as the
    row does, and those radices; None where a count is negative or a number would not fit in 62 bits."""
    radix = rows.max(axis=0, initial=0) + 1
    if rows.min(initial=0) < 0 or float(np.prod(radix.astype(np.float64))) >= 2.0**62:
        return None
    place = np.cumprod(np.concatenate([radix[1:], [1]])[::-1])[::-1]  # place[i] = prod(radix[i + 1:])
    return rows @ place, radix
