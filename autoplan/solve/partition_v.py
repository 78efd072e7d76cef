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
:meth:`PartitionProblem.evaluate` does, so its optimum is the value evaluate gives, bit for bit.
"""

from __future__ import annotations

import numpy as np

from autoplan.solve.partition_problem import INF, Partition, PartitionProblem


def partition_v(problem: PartitionProblem) -> Partition | None:
    """The optimal V partition (module docstring), or None when none fits the memory."""
    L, p = problem.layers, problem.pp
    if not problem.v_shape or problem.virtual_stages != 2:
        raise ValueError("partition_v takes the V placement only: two chunks per stage in a V.")
    if L < 2 * p:
        return None
    best = np.full((L + 1, L + 1), INF)
    best[0, L] = -INF
    back = []
    for k in range(p):
        best, came_from = _stage_step(problem, k, best)
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
    t, m, a, cut = problem._t, problem._m, problem._a, problem._cut
    receive, send = float(problem.sent(chunk)), float(problem.sent(chunk + 1))
    time = (t[None, :] - t[:, None]) + (cut[:, None] * receive + cut[None, :] * send)
    flight = problem.in_flight[stage]
    used = (m[None, :] - m[:, None]) + flight * (a[None, :] - a[:, None])
    return time, used


def _stage_step(problem: PartitionProblem, k: int, best: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """F_{k+1} from F_k (module docstring) and, per pair (x', y'), the flat index x * (L + 1) + y it came from.
    Arrays run (y', x, y) over the x and y that F_k reached, so a pair out of reach is an inf, never a choice."""
    L, p = problem.layers, problem.pp
    first, first_bytes = _chunk_terms(problem, k, k)
    second, second_bytes = _chunk_terms(problem, 2 * p - 1 - k, k)
    first, first_bytes = problem.extra_time_s[k] + first, problem.extra_bytes[k] + first_bytes
    second = np.where(np.less.outer(np.arange(L + 1), np.arange(L + 1)), second, INF)  # y' < y, or none
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


def _bounds(back: list[np.ndarray], turn: int, layers: int) -> list[int]:
    """The chunk boundaries b_0..b_2p of the path ending at the pair (turn, turn): x_k then y_k reversed."""
    xs, ys, x, y = [turn], [turn], turn, turn
    for came_from in reversed(back):
        x, y = divmod(int(came_from[x, y]), layers + 1)
        xs.append(x)
        ys.append(y)
    return [*reversed(xs[1:]), turn, *ys[1:]]
