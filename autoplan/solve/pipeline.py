"""Pipeline partition: layers into ``pp * v`` contiguous chunks, minimising the slowest stage (the
methods, their exactness and costs: docs/ilp.md, section 3).

Chunk ``c`` runs on stage ``c % pp`` (autoplan/types/layout.py; ``v`` = 1 for GPipe and 1F1B,
``v >= 2`` for interleaved 1F1B, Narayanan et al. SC'21 section 2.2.2). With per-layer time ``t_i``,
static bytes ``m_i``, activation bytes ``a_i`` (one micro-batch), chunk ``c`` holding layers
``[b_c, b_{c+1})`` and stage ``k`` the chunks ``c = k (mod pp)``:

    T_k = sum over its chunks of (sum t[b_c:b_{c+1}] + cut[b_c] [c > 0] + cut[b_{c+1}] [c < pp v - 1])
          + extra_time_s[k]
    M_k = sum over its chunks of (sum m[b_c:b_{c+1}] + in_flight[k] * sum a[b_c:b_{c+1}])
          + extra_bytes[k]  <=  capacity_bytes
    minimise max_k T_k,  every chunk non-empty,  b_0 = 0,  b_{pp v} = L

This is what CostModel charges (autoplan/cost/model.py). :func:`partition` solves it exactly by
the first method that applies, after :func:`_surely_infeasible`: identical layers, the greedy
:func:`_partition_uniform`; ``v = 1``, the dynamic program :func:`_partition_dp`

    F[0][0] = 0,   F[k+1][j] = min over i < j with M_k(i, j) <= capacity of max(F[k][i], T_k(i, j));

the V placement (v = 2, zbv and dualpipev), the DP over pairs of boundaries of solve/partition_v.py;
otherwise the ILP :func:`partition_ilp` under a time limit, with :func:`_partition_fill` and even
chunks as fallbacks. Tests hold each to :func:`partition_brute_force`.
"""

from __future__ import annotations

import heapq
import itertools
from typing import Sequence

import numpy as np

from autoplan.solve.backend import solve_model, variable
from autoplan.solve.partition_problem import INF, Partition, PartitionProblem, chunk_stages, stage_neighbours
from autoplan.solve.partition_v import partition_v
from autoplan.types.layout import local_chunk

__all__ = ["INF", "Partition", "PartitionProblem", "partition", "partition_brute_force", "partition_ilp"]


def partition(
    problem: PartitionProblem, *, solver: str = "highs", time_limit_s: float = 0.25, hints: Sequence[list[int]] = ()
) -> Partition | None:
    """The optimal partition (module docstring: DP, greedy or ILP); None when none fits the memory.
    ``time_limit_s`` bounds the ILP (method 3) only; past it the best of its incumbent, the fill
    and even chunks is returned. ``hints``: other partitions' bounds, which bound the V placement's DP."""
    L, C = problem.layers, problem.chunks
    if C > L or L == 0 or _surely_infeasible(problem):
        return None
    if C == L:  # one layer per chunk: the only partition
        return _checked(problem, list(range(L + 1)))
    alike = (problem.layer_time_s, problem.layer_static_bytes, problem.layer_activation_bytes)
    if problem.uniform_cuts() and all(xs.count(xs[0]) == L for xs in alike):  # every layer alike (L > 0 here)
        return _partition_uniform(problem)
    if problem.virtual_stages == 1:
        return _partition_dp(problem)
    if problem.v_shape and problem.virtual_stages == 2:
        return partition_v(problem, hints=hints)
    even = _checked(problem, _bounds_from_counts([L // C + (c < L % C) for c in range(C)], 1, v_shape=False))
    candidates = [
        p
        for p in (partition_ilp(problem, solver=solver, time_limit_s=time_limit_s), _partition_fill(problem), even)
        if p
    ]
    return min(candidates, key=lambda p: p.max_stage_time_s) if candidates else None


def _surely_infeasible(problem: PartitionProblem, *, margin: float = 1e-6) -> bool:
    """No partition fits the memory (module docstring): stage k holds at least v layers, so
    M_k >= extra_bytes[k] + its v lightest layers; and the stages together hold every layer, so
    the fullest holds at least the mean of extra_bytes plus each layer at the stage where it is
    lightest. ``margin`` keeps rounding from deciding: a near miss goes to the exact methods."""
    capacity = problem.capacity_bytes
    if capacity == INF:
        return False
    limit = capacity + margin * abs(capacity)
    static, act, v = problem.layer_static_bytes, problem.layer_activation_bytes, problem.virtual_stages
    low, high = min(problem.in_flight), max(problem.in_flight)
    total = sum(problem.extra_bytes) + sum(m + min(low * a, high * a) for m, a in zip(static, act))
    if total / problem.pp > limit:
        return True
    per_stage = np.asarray(static)[None, :] + np.asarray(problem.in_flight)[:, None] * np.asarray(act)[None, :]
    lightest = np.sort(per_stage, axis=1)[:, :v].tolist()  # each stage's v lightest layers, rising
    return any(problem.extra_bytes[k] + sum(lightest[k]) > limit for k in range(problem.pp))


def _checked(problem: PartitionProblem, bounds: list[int]) -> Partition | None:
    value = problem.evaluate(bounds)
    return Partition(bounds=bounds, max_stage_time_s=value) if value < INF else None


def _partition_dp(problem: PartitionProblem) -> Partition | None:
    """The exact DP  F[k][j] = min_i max(F[k-1][i], T_k(i, j))  over feasible (i, j), each stage
    one vectorised (L+1) x (L+1) step (v = 1)."""
    L, pp = problem.layers, problem.pp
    seg_t = np.subtract.outer(problem._t, problem._t).T  # seg[i, j] = t[j] - t[i]
    order = np.arange(L + 1)
    nonempty = order[None, :] > order[:, None]
    limited = problem.capacity_bytes != INF
    if limited:
        seg_m = np.subtract.outer(problem._m, problem._m).T
        seg_a = np.subtract.outer(problem._a, problem._a).T
    else:  # every chunk fits: only the empty ones are ruled out
        seg_t = np.where(nonempty, seg_t, INF)
    best = np.full(L + 1, INF)
    best[0] = 0.0
    cuts = []
    zero = np.zeros(L + 1)
    for k in range(pp):
        receive, send = (problem._cut if k > 0 else zero), (problem._cut if k < pp - 1 else zero)
        time = seg_t + problem.extra_time_s[k] + receive[:, None] + send[None, :]
        if limited:
            fits = seg_m + problem.in_flight[k] * seg_a + problem.extra_bytes[k] <= problem.capacity_bytes
            value = np.where(nonempty & fits, np.maximum(best[:, None], time), INF)
        else:
            value = np.maximum(best[:, None], time)
        cuts.append(np.argmin(value, axis=0))
        best = value[cuts[-1], order]
    if best[L] == INF:
        return None
    bounds = [L]
    for k in range(pp - 1, -1, -1):
        bounds.append(int(cuts[k][bounds[-1]]))
    bounds.reverse()
    return Partition(bounds=bounds, max_stage_time_s=problem.evaluate(bounds))


def _partition_uniform(problem: PartitionProblem) -> Partition | None:
    """Identical layers: each stage's layer count by the greedy of the module docstring (method 2)."""
    L, pp, v = problem.layers, problem.pp, problem.virtual_stages
    t, cut = problem.layer_time_s[0], problem.mean_cut_s()  # every cut costs the same here
    neighbours = stage_neighbours(pp, v, problem.v_shape)  # the cuts each stage's chunks pay
    base = [problem.extra_time_s[k] + cut * neighbours[k] for k in range(pp)]
    per = [problem.layer_static_bytes[0] + problem.in_flight[k] * problem.layer_activation_bytes[0] for k in range(pp)]
    most = [_most_layers(problem.capacity_bytes - problem.extra_bytes[k], per[k], L) for k in range(pp)]
    if any(n < v for n in most):
        return None
    counts = [v] * pp
    ready = [(base[k] + (v + 1) * t, (v + 1) * per[k], k) for k in range(pp) if most[k] > v]
    heapq.heapify(ready)
    for _ in range(L - pp * v):  # each entry's k is its own: the least pops first however the heap lies
        if not ready:
            return None  # the memory holds fewer layers than the model has
        k = ready[0][2]
        counts[k] += 1
        if counts[k] < most[k]:
            heapq.heapreplace(ready, (base[k] + (counts[k] + 1) * t, (counts[k] + 1) * per[k], k))
        else:
            heapq.heappop(ready)
    return _checked(problem, _bounds_from_counts(counts, v, v_shape=problem.v_shape))


def _most_layers(room_bytes: float, per_layer_bytes: float, layers: int) -> int:
    """The most identical layers of ``per_layer_bytes`` that fit in ``room_bytes`` (-1: not even none)."""
    if room_bytes < 0:
        return -1
    if per_layer_bytes <= 0 or room_bytes == INF:
        return layers
    n = min(layers, int(room_bytes // per_layer_bytes))
    while n > 0 and n * per_layer_bytes > room_bytes:
        n -= 1
    while n < layers and (n + 1) * per_layer_bytes <= room_bytes:
        n += 1
    return n


def _bounds_from_counts(counts: list[int], v: int, *, v_shape: bool) -> list[int]:
    """Chunk boundaries giving stage k ``counts[k]`` layers over its v chunks, as evenly as
    possible; the later chunks take the remainder (interleaved 1F1B's warm-up holds the fewest
    micro-batches of a stage's last chunk)."""
    pp = len(counts)
    if v == 1:  # chunk c is stage c's only one
        return [0, *itertools.accumulate(counts)]
    sizes = [[n // v + (q >= v - n % v) for q in range(v)] for n in counts]
    stages = chunk_stages(pp, v, v_shape)
    return [0, *itertools.accumulate(sizes[stages[c]][c // pp] for c in range(pp * v))]  # c // pp: local_chunk


def _partition_fill(problem: PartitionProblem, *, steps: int = 40) -> Partition | None:
    """A fast partition for method 3 (not proved optimal): bisect on a target T; for each, fill
    the chunks in order, each taking its stage's fair share (T - stage time so far) / (its chunks
    left) of layers, rounded down or to the nearest layer; keep the best partition seen."""
    low = (problem._t[-1] + sum(problem.extra_time_s)) / problem.pp
    high, best = 2.0 * low + 1.0, None
    for _ in range(steps):
        target = (low + high) / 2.0
        found = [_checked(problem, _fill(problem, target, nearest=nearest)) for nearest in (False, True)]
        values = [p.max_stage_time_s for p in found if p]
        best = min([p for p in (best, *found) if p], key=lambda p: p.max_stage_time_s, default=None)
        low, high = (low, target) if values and min(values) <= target else (target, high)
    return best


def _fill(problem: PartitionProblem, target: float, *, nearest: bool) -> list[int]:
    """Chunk boundaries giving each chunk its stage's fair share of ``target`` (see _partition_fill;
    boundaries are charged their mean cut: the fill is a heuristic, :meth:`PartitionProblem.evaluate`
    prices what it returns exactly)."""
    L, C, pp, v = problem.layers, problem.chunks, problem.pp, problem.virtual_stages
    cut = problem.mean_cut_s()
    used = [problem.extra_time_s[k] + cut * sum(problem.neighbours(c) for c in problem.chunks_of(k)) for k in range(pp)]
    bounds = [0]
    for c in range(C):
        k, i = problem.stage_of(c), bounds[-1]
        goal = problem._t[i] + (target - used[k]) / (v - local_chunk(c, pp=pp))
        j = max(i, int(np.searchsorted(problem._t, goal, side="right")) - 1)
        if nearest and j < L and goal - problem._t[j] > problem._t[j + 1] - goal:
            j += 1
        j = L if c == C - 1 else min(max(j, i + 1), L - (C - c - 1))  # every later chunk keeps a layer
        used[k] += float(problem._t[j] - problem._t[i])
        bounds.append(j)
    return bounds


def partition_ilp(problem: PartitionProblem, *, solver: str = "highs", time_limit_s: float = 30.0) -> Partition | None:
    """The problem as an ILP over the chunk staircase: u[i,c] = 1 when layer i lies in chunk c or
    later (c = 1..C-1, C = pp v), non-increasing in c and non-decreasing in i, and the chunk
    index sum_c u[i,c] rising by 0 or 1 per layer from 0 to C-1 (contiguous, non-empty chunks).
    Layer i is in chunk c exactly when u[i,c] - u[i,c+1] = 1, so each T_k and M_k is linear in u;
    and so is chunk c's receive, sum_i cut[i] (u[i,c] - u[i-1,c]) (layer i starts chunk c);
    T >= every T_k, every M_k <= capacity, minimise T. Only u inside a layer's window of chunks
    (c <= i, and c >= i - (L - C) so the later chunks keep a layer each) are variables."""
    L, C, pp = problem.layers, problem.chunks, problem.pp
    if C > L or L == 0:
        return None
    import pulp  # here, not at import: a plan whose ILPs run in highspy never loads PuLP (cli/startup.py)

    model = pulp.LpProblem("partition", pulp.LpMinimize)
    slack = L - C
    free = {
        (i, c): variable(model, f"u{i}_{c}", low=0, up=1, cat="Binary")
        for i in range(L)
        for c in range(max(1, i - slack + 1), min(i, C - 1) + 1)
    }

    def u(i: int, c: int):
        if (i, c) in free:
            return free[i, c]
        return 1 if c <= 0 or (c < C and c <= i - slack) else 0

    if not free:  # C = 1 or C = L: one partition only
        return _checked(problem, _staircase_bounds(u, L, C))
    for i, c in free:  # the last layer is always in the last chunk, so i + 1 < L
        model += u(i, c) - u(i, c + 1) >= 0
        model += u(i + 1, c) - u(i, c) >= 0
    for i in range(L - 1):
        if any((j, c) in free for j in (i, i + 1) for c in range(1, C)):
            model += pulp.lpSum(u(i + 1, c) - u(i, c) for c in range(1, C)) <= 1
    bound = variable(model, "T", low=0)
    for k in range(pp):
        mine = [(i, c) for c in problem.chunks_of(k) for i in range(c, c + slack + 1)]  # layer i may be in chunk c
        member = {(i, c): u(i, c) - u(i, c + 1) for i, c in mine}
        cuts = [_chunk_start_s(problem, u, c) for c in problem.chunks_of(k) if problem.sent(c)]  # receive
        cuts += [_chunk_start_s(problem, u, c + 1) for c in problem.chunks_of(k) if problem.sent(c + 1)]  # send
        model += bound >= pulp.lpSum(
            problem.layer_time_s[i] * x for (i, _), x in member.items()
        ) + problem.extra_time_s[k] + pulp.lpSum(cuts)
        if problem.capacity_bytes < INF:
            weight = [
                problem.layer_static_bytes[i] + problem.in_flight[k] * problem.layer_activation_bytes[i]
                for i in range(L)
            ]
            model += (
                pulp.lpSum(weight[i] * x for (i, _), x in member.items()) + problem.extra_bytes[k]
                <= problem.capacity_bytes
            )
    model += bound
    status = solve_model(model, solver=solver, time_limit_s=time_limit_s)
    if not status.has_solution:
        return None
    return _checked(problem, _staircase_bounds(u, L, C))


def _chunk_start_s(problem: PartitionProblem, u, chunk: int):
    """The cut before chunk ``chunk`` (>= 1) of the staircase: layer i starts it when u[i,c] - u[i-1,c] = 1."""
    import pulp

    return pulp.lpSum(float(problem._cut[i]) * (u(i, chunk) - u(i - 1, chunk)) for i in range(1, problem.layers))


def _staircase_bounds(u, layers: int, chunks: int) -> list[int]:
    """Chunk boundaries of a solved staircase: layer i is in chunk sum_c u[i,c]."""
    import pulp

    chunk = [round(sum(pulp.value(u(i, c)) for c in range(1, chunks))) for i in range(layers)]
    return [0] + [i for i in range(1, layers) if chunk[i] != chunk[i - 1]] + [layers]


def partition_brute_force(problem: PartitionProblem) -> Partition | None:
    """Every choice of pp v - 1 cut points (small cases only)."""
    best = None
    for cuts in itertools.combinations(range(1, problem.layers), problem.chunks - 1):
        bounds = [0, *cuts, problem.layers]
        value = problem.evaluate(bounds)
        if value < INF and (best is None or value < best.max_stage_time_s):
            best = Partition(bounds=bounds, max_stage_time_s=value)
    return best
