"""PartitionProblem.totals in Python floats is the numpy-scalar sum it replaced, bit for bit, on random problems
(uneven layers, cuts and in-flight counts; looping and V placements) and random partitions."""

from __future__ import annotations

import random

from autoplan.solve.partition_problem import PartitionProblem


def _numpy_totals(problem: PartitionProblem, bounds: list[int]) -> tuple[list[float], list[float]]:
    """The sums as totals made them before, one numpy float64 scalar at a time."""
    times, used = list(problem.extra_time_s), list(problem.extra_bytes)
    for c in range(problem.chunks):
        k, i, j = problem.stage_of(c), bounds[c], bounds[c + 1]
        times[k] += float(problem._t[j] - problem._t[i]) + problem.chunk_cuts_s(c, i, j)
        used[k] += float(problem._m[j] - problem._m[i] + problem.in_flight[k] * (problem._a[j] - problem._a[i]))
    return times, used


def test_totals_are_the_numpy_scalar_sums():
    rng = random.Random(7)
    for _ in range(300):
        pp, v = rng.choice([2, 3, 4, 8]), rng.choice([1, 2, 3])
        v_shape = v == 2 and rng.random() < 0.5
        layers = rng.randint(pp * v, 40)
        problem = PartitionProblem(
            layer_time_s=[rng.uniform(1e-4, 3e-2) for _ in range(layers)],
            layer_static_bytes=[rng.uniform(1e6, 4e9) for _ in range(layers)],
            layer_activation_bytes=[rng.uniform(1e5, 2e9) for _ in range(layers)],
            pp=pp,
            extra_time_s=[rng.uniform(0, 1e-2) for _ in range(pp)],
            extra_bytes=[rng.uniform(0, 1e9) for _ in range(pp)],
            in_flight=[rng.choice([1, 2.5, rng.uniform(0, 9)]) for _ in range(pp)],
            p2p_s=1e-3,
            capacity_bytes=rng.choice([float("inf"), 6e10]),
            virtual_stages=v,
            cut_s=[rng.uniform(0, 1e-3) for _ in range(layers + 1)],
            v_shape=v_shape,
        )
        cuts = sorted(rng.sample(range(1, layers), pp * v - 1))
        bounds = [0, *cuts, layers]
        assert problem.totals(bounds) == _numpy_totals(problem, bounds)
