"""The pipeline partition DP is exact: it equals an ILP and brute force on random instances."""
import random

import pytest

from autoplan.solve.pipeline import PartitionProblem, partition, partition_brute_force, partition_ilp


def _random_problem(rng):
    layers = rng.randint(1, 9)
    pp = rng.randint(1, min(4, layers))
    return PartitionProblem(
        layer_time_s=[rng.uniform(0.2, 2.0) for _ in range(layers)],
        layer_static_bytes=[rng.uniform(1, 3) for _ in range(layers)],
        layer_activation_bytes=[rng.uniform(0, 2) for _ in range(layers)],
        pp=pp, extra_time_s=[rng.uniform(0, 2) for _ in range(pp)], extra_bytes=[rng.uniform(0, 3) for _ in range(pp)],
        in_flight=[rng.choice([pp - k, 1, 3]) for k in range(pp)], p2p_s=rng.uniform(0, 0.3), capacity_bytes=rng.uniform(4, 16))


def _value(found):
    return None if found is None else found.max_stage_time_s


@pytest.mark.parametrize("seed", range(40))
def test_dp_equals_ilp_and_brute_force(seed):
    problem = _random_problem(random.Random(seed))
    dp, ilp, brute = partition(problem), partition_ilp(problem), partition_brute_force(problem)
    if brute is None:
        assert dp is None and ilp is None
        return
    assert _value(dp) == pytest.approx(brute.max_stage_time_s, rel=1e-9)
    assert _value(ilp) == pytest.approx(brute.max_stage_time_s, rel=1e-7)
    assert problem.evaluate(dp.bounds) == pytest.approx(dp.max_stage_time_s)


def test_uniform_layers_split_evenly_and_extras_shift_layers():
    even = PartitionProblem([1.0] * 8, [0.0] * 8, [0.0] * 8, 4, [0.0] * 4, [0.0] * 4, [1.0] * 4, 0.0, 1.0)
    assert partition(even).bounds == [0, 2, 4, 6, 8]
    heavy_head = PartitionProblem([1.0] * 8, [0.0] * 8, [0.0] * 8, 2, [0.0, 2.0], [0.0] * 2, [1.0] * 2, 0.0, 1.0)
    assert partition(heavy_head).bounds == [0, 5, 8]      # the head's 2 s take the place of two layers


def test_memory_limit_moves_layers_off_the_first_stage():
    # 1F1B: stage 0 holds 2 micro-batches of activations, stage 1 one; time alone would split 2/2
    problem = PartitionProblem([1.0] * 4, [0.0] * 4, [1.0] * 4, 2, [0.0] * 2, [0.0] * 2, [2.0, 1.0], 0.0, 3.0)
    assert partition(problem).bounds == [0, 1, 4]
    assert partition(PartitionProblem([1.0] * 4, [0.0] * 4, [1.0] * 4, 2, [0.0] * 2, [0.0] * 2, [2.0, 1.0], 0.0, 1.5)) is None
