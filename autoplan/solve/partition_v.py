"""The exact pipeline partition of the V placement (zbv, dualpipev: two chunks per stage, stage k holding
chunks k and 2p - 1 - k, types/layout.py), a dynamic program over pairs of boundaries (docs/ilp.md, section 3).

Write the 2p + 1 chunk boundaries from both ends, ``x_k = b_k`` and ``y_k = b_{2p-k}``: ``x_0 = 0``,
``y_0 = L``, ``x_0 < x_1 < ... < x_p = y_p < ... < y_1 < y_0``. Stage k holds layers ``[x_k, x_{k+1})`` and
``[y_{k+1}, y_k)``, so with the cuts each chunk pays (its receive and its send, solve/pipeline.py) its time
and memory depend on (x_k, y_k, x_{k+1}, y_{k+1}) alone:

    T_k = extra_k + P_k(x_k, x_{k+1}) + Q_k(y_{k+1}, y_k),   M_k = extra_bytes_k + Pm_k(x_k, x_{k+1}) + Qm_k(...)

``P_k(i, j) = t[i:j] + cut[i] sent(k) + cut[j] sent(k + 1)`` and likewise for chunk 2p - 1 - k. The stages
nest from the outside in, so the slowest of stages 0..k-1 over the pair (x_k, y_k) is a DP:

    F_0(0, L) = -inf;  F_{k+1}(x', y') = min over x < x', y > y' with M_k <= capacity of max(F_k(x, y), T_k)

with ``y' - x' >= 2 (p - 1 - k)`` (the inner chunks keep a layer each) and ``x' = y'`` at k = p - 1; the
optimum is min_z F_p(z, z). Every partition is one path through the pairs and every path one partition, so
the DP is exact, in O(p L^4 / 24) steps (vectorised per x'); it adds T_k and M_k in the order
:meth:`PartitionProblem.evaluate` does, so its optimum is the value evaluate gives, bit for bit. With a ceiling
U >= the optimum (the best of ``hints``, earlier answers of like problems, at evaluate's value), a pair whose
F exceeds U, or whose inner stages' mean time does, is on no optimal path, and dropping it changes no pair
on the path the DP returns (docs/ilp.md, section 3): the few pairs left are stepped as one array.
"""

from __future__ import annotations

import itertools
from typing import Sequence

import numpy as np

from autoplan.solve.partition_problem import INF, Partition, PartitionProblem

SPARSE_CELLS = 1 << 18  # (target, source) cells of one sparse step: 2 MiB per float64 array; past it, the dense step


def partition_v(problem: PartitionProblem, *, hints: Sequence[list[int]] = ()) -> Partition | None:
    """The optimal V partition (module docstring), or None when none fits the memory; ``hints``: boundaries
    b_0..b_2p of other partitions, whose best value here bounds the DP (none: it runs unbounded)."""
    L, p = problem.layers, problem.pp
    if not problem.v_shape or problem.virtual_stages != 2:
        raise ValueError("partition_v takes the V placement only: two chunks per stage in a V.")
    if L < 2 * p:
        return None
    ceiling = _ceiling(problem, hints)
    best = np.full((L + 1, L + 1), INF)
    best[0, L] = -INF
    back = []
    for k in range(p):
        best, came_from = _stage_step(problem, k, _pruned(problem, k, best, ceiling), ceiling)
        back.append(came_from)
    turn = np.diagonal(best)
    z = int(np.argmin(turn))
    if turn[z] == INF:
        return None
    bounds = _bounds(back, z, L)
    return Partition(bounds=bounds, max_stage_time_s=problem.evaluate(bounds))


def _chunk_terms(problem: PartitionProblem, chunk: int, stage: int) -> tuple[np.ndarray, np.ndarray]:
    """(time, bytes)[i, j] of chunk ``chunk`` = layers[i:j] on ``stage``, its cuts included, summed as
    PartitionProblem.totals sums them."""
    spans, cut = _spans(problem), problem._cut
    receive, send = float(problem.sent(chunk)), float(problem.sent(chunk + 1))
    time = spans[0] + (cut[:, None] * receive + cut[None, :] * send)
    used = spans[1] + problem.in_flight[stage] * spans[2]
    return time, used


def _spans(problem: PartitionProblem) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(time, static bytes, activation bytes)[i, j] of layers[i:j], the prefix sums' differences: the same arrays at
    every stage and chunk, so kept on the problem (its layers are not changed once built)."""
    kept = problem.__dict__.get("_v_spans")
    if kept is None:
        t, m, a = problem._t, problem._m, problem._a
        kept = (t[None, :] - t[:, None], m[None, :] - m[:, None], a[None, :] - a[:, None])
        problem.__dict__["_v_spans"] = kept
    return kept


def _stage_step(problem: PartitionProblem, k: int, best: np.ndarray, ceiling: float) -> tuple[np.ndarray, np.ndarray]:
    """F_{k+1} from F_k (module docstring) and, per pair (x', y'), the flat index x * (L + 1) + y it came from:
    over the few pairs reached when a ceiling left few (:func:`_sparse_step`), else over all (:func:`_dense_step`)."""
    L, p = problem.layers, problem.pp
    first, first_bytes = _chunk_terms(problem, k, k)
    second, second_bytes = _chunk_terms(problem, 2 * p - 1 - k, k)
    first, first_bytes = problem.extra_time_s[k] + first, problem.extra_bytes[k] + first_bytes
    inward = np.less.outer(np.arange(L + 1), np.arange(L + 1))
    first = np.where(inward, first, INF)  # x < x', or none
    second = np.where(inward, second, INF)  # y' < y, or none
    terms = (first, first_bytes, second, second_bytes)
    stepped = _sparse_step(problem, k, best, np.flatnonzero(best < INF), terms, ceiling) if ceiling < INF else None
    return stepped if stepped is not None else _dense_step(problem, k, best, terms)


def _dense_step(problem: PartitionProblem, k: int, best: np.ndarray, terms: tuple) -> tuple[np.ndarray, np.ndarray]:
    """:func:`_stage_step` with arrays that run (y', x, y) over the x and y that F_k reached, so a pair out of
    reach is an inf, never a choice."""
    L, p = problem.layers, problem.pp
    first, first_bytes, second, second_bytes = terms
    rows, cols = np.flatnonzero((best < INF).any(axis=1)), np.flatnonzero((best < INF).any(axis=0))
    out, came_from = np.full((L + 1, L + 1), INF), np.zeros((L + 1, L + 1), dtype=np.int64)
    if rows.size == 0:  # no pair reached: no partition fits
        return out, came_from
    x_low, y_high = int(rows[0]), int(cols[-1]) + 1
    last, need = k == p - 1, 2 * (p - 1 - k)
    for x_next in range(max(k + 1, x_low + 1), L - 2 * p + k + 2):
        y_first, y_end = (x_next, x_next + 1) if last else (x_next + need, L - k)
        y_low = max(int(cols[0]), y_first + 1)
        if y_first >= y_end or y_low >= y_high:
            continue
        xs, ys, y_nexts = slice(x_low, x_next), slice(y_low, y_high), slice(y_first, y_end)
        time = first[xs, x_next][None, :, None] + second[y_nexts, ys][:, None, :]
        value = np.maximum(best[xs, ys][None, :, :], time, out=time)
        if problem.capacity_bytes != INF:
            used = first_bytes[xs, x_next][None, :, None] + second_bytes[y_nexts, ys][:, None, :]
            value = np.where(used <= problem.capacity_bytes, value, INF)
        value = value.reshape(y_end - y_first, -1)
        pick = np.argmin(value, axis=1)
        out[x_next, y_nexts] = value[np.arange(y_end - y_first), pick]
        width = y_high - y_low
        came_from[x_next, y_nexts] = (x_low + pick // width) * (L + 1) + y_low + pick % width
    return out, came_from


def _sparse_step(
    problem: PartitionProblem, k: int, best: np.ndarray, sources: np.ndarray, terms: tuple, ceiling: float
) -> tuple[np.ndarray, np.ndarray] | None:
    """:func:`_dense_step` over the pairs F_k holds (``sources``, in flat order, so a tie goes to the first as
    there) into the pairs (x', y') some source reaches with each chunk at most ``ceiling``; None when that is
    more than SPARSE_CELLS (source, target) cells."""
    L, p = problem.layers, problem.pp
    first, first_bytes, second, second_bytes = terms
    span = np.arange(L + 1)
    xs, ys = np.divmod(sources, L + 1)
    x_ok = (first[xs] <= ceiling).any(axis=0)  # first is inf unless x < x'
    x_ok &= (span >= k + 1) & (span < L - 2 * p + k + 2)
    y_ok = (second[:, ys] <= ceiling).any(axis=1) & (span < L - k)  # second is inf unless y' < y
    last = k == p - 1
    shape = np.equal.outer(span, span) if last else (span[None, :] >= span[:, None] + 2 * (p - 1 - k))
    to_x, to_y = np.nonzero(x_ok[:, None] & y_ok[None, :] & shape & (last or _room(problem, k + 1, ceiling)))
    if to_x.size * sources.size > SPARSE_CELLS:
        return None
    out, came_from = np.full((L + 1, L + 1), INF), np.zeros((L + 1, L + 1), dtype=np.int64)
    if to_x.size == 0 or sources.size == 0:
        return out, came_from
    time = _cells(first.T, to_x, xs) + _cells(second, to_y, ys)  # first[x, x'] + second[y', y]: inf unless inward
    value = np.maximum(best.ravel()[sources][None, :], time, out=time)
    if problem.capacity_bytes != INF:
        used = _cells(first_bytes.T, to_x, xs) + _cells(second_bytes, to_y, ys)
        value = np.where(used <= problem.capacity_bytes, value, INF)
    pick = np.argmin(value, axis=1)
    out[to_x, to_y] = value[np.arange(to_x.size), pick]
    came_from[to_x, to_y] = sources[pick]
    return out, came_from


def _cells(table: np.ndarray, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """``table[rows[t], cols[s]]`` per (t, s), taken one axis at a time: the same floats as the broadcast fancy
    index, several times faster at the sparse step's thousands of cells."""
    return np.take(np.take(table, rows, axis=0), cols, axis=1)


def _ceiling(problem: PartitionProblem, hints: Sequence[list[int]]) -> float:
    """The least value here of ``hints`` and even chunks (inf when none fits), with a slack of 1e-9 of the
    times for the rounding of :func:`_pruned`'s mean: a value every optimum is at most. Inf where a time is
    negative: the pruning holds a chunk's time (blocks, cuts, extra) to be no less than none."""
    L, chunks = problem.layers, 2 * problem.pp
    if min(problem.layer_time_s, default=0.0) < 0 or min(problem.extra_time_s) < 0 or problem._cut.min() < 0:
        return INF
    even = [0, *itertools.accumulate(L // chunks + (c < L % chunks) for c in range(chunks))]
    fits = [b for b in (*hints, even) if len(b) == chunks + 1 and b[0] == 0 and b[-1] == L]
    least = min(problem.evaluate(list(b)) for b in fits)
    scale = abs(least) + float(problem._t[-1]) + sum(map(abs, problem.extra_time_s)) + float(problem._cut.sum())
    return least + 1e-9 * scale if least < INF else INF


def _pruned(problem: PartitionProblem, k: int, best: np.ndarray, ceiling: float) -> np.ndarray:
    """F_k without the pairs on no path of value <= ``ceiling``: F_k(x, y) above it, or :func:`_room`'s."""
    if ceiling == INF:
        return best
    return np.where((best > ceiling) | ~_room(problem, k, ceiling), INF, best)


def _room(problem: PartitionProblem, k: int, ceiling: float) -> np.ndarray:
    """Per pair (x, y), whether the p - k stages that share [x, y) from stage k on can each take at most
    ``ceiling``: their mean time (their extra times, the blocks, the cuts left out: none is negative) is no more."""
    L = problem.layers
    if k == 0:
        return np.ones((L + 1, L + 1), dtype=bool)
    rooms = problem.__dict__.setdefault("_v_rooms", {})  # asked twice per stage: F_k's pruning, F_k's targets
    if (k, ceiling) not in rooms:
        rooms[k, ceiling] = (sum(problem.extra_time_s[k:]) + _spans(problem)[0]) / (problem.pp - k) <= ceiling
    return rooms[k, ceiling]


def _bounds(back: list[np.ndarray], turn: int, layers: int) -> list[int]:
    """The chunk boundaries b_0..b_2p of the path ending at the pair (turn, turn): x_k then y_k reversed."""
    xs, ys, x, y = [turn], [turn], turn, turn
    for came_from in reversed(back):
        x, y = divmod(int(came_from[x, y]), layers + 1)
        xs.append(x)
        ys.append(y)
    return [*reversed(xs[1:]), turn, *ys[1:]]
