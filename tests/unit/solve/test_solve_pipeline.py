"""The pipeline partition is exact: the DP (one chunk per stage), the greedy (interleaved, identical
layers) and the ILP (interleaved, any layers) equal brute force on random instances, including
unlike layers that cut at tensors of different sizes (a model's top-level modules)."""

import random

import pytest

from autoplan.solve.pipeline import PartitionProblem, _partition_dp, partition, partition_brute_force, partition_ilp


def _random_cuts(rng, layers):
    """Per-boundary p2p times, as unlike layers have: the sizes of the tensors they cut at differ."""
    return [rng.uniform(0, 0.6) for _ in range(layers + 1)]


def _random_problem(rng, *, cuts=False):
    layers = rng.randint(1, 9)
    pp = rng.randint(1, min(4, layers))
    return PartitionProblem(
        layer_time_s=[rng.uniform(0.2, 2.0) for _ in range(layers)],
        layer_static_bytes=[rng.uniform(1, 3) for _ in range(layers)],
        layer_activation_bytes=[rng.uniform(0, 2) for _ in range(layers)],
        pp=pp,
        extra_time_s=[rng.uniform(0, 2) for _ in range(pp)],
        extra_bytes=[rng.uniform(0, 3) for _ in range(pp)],
        in_flight=[rng.choice([pp - k, 1, 3]) for k in range(pp)],
        p2p_s=rng.uniform(0, 0.3),
        capacity_bytes=rng.uniform(4, 16),
        cut_s=_random_cuts(rng, layers) if cuts else None,
    )


def _value(found):
    return None if found is None else found.max_stage_time_s


@pytest.mark.parametrize("cuts", [False, True])
@pytest.mark.parametrize("seed", range(40))
def test_dp_equals_ilp_and_brute_force(seed, cuts):
    problem = _random_problem(random.Random(seed), cuts=cuts)
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
    assert partition(heavy_head).bounds == [0, 5, 8]  # the head's 2 s take the place of two layers


def test_memory_limit_moves_layers_off_the_first_stage():
    # 1F1B: stage 0 holds 2 micro-batches of activations, stage 1 one; time alone would split 2/2
    problem = PartitionProblem([1.0] * 4, [0.0] * 4, [1.0] * 4, 2, [0.0] * 2, [0.0] * 2, [2.0, 1.0], 0.0, 3.0)
    assert partition(problem).bounds == [0, 1, 4]
    assert (
        partition(PartitionProblem([1.0] * 4, [0.0] * 4, [1.0] * 4, 2, [0.0] * 2, [0.0] * 2, [2.0, 1.0], 0.0, 1.5))
        is None
    )


def _random_interleaved(rng, *, uniform, v=None, cuts=False):
    pp, v = rng.randint(1, 3), v or rng.randint(2, 3)
    layers = rng.randint(pp * v, min(10, pp * v + 5))

    def per_layer(low, high):
        return [rng.uniform(low, high)] * layers if uniform else [rng.uniform(low, high) for _ in range(layers)]

    return PartitionProblem(
        layer_time_s=per_layer(0.2, 2.0),
        layer_static_bytes=per_layer(1, 3),
        layer_activation_bytes=per_layer(0, 2),
        pp=pp,
        extra_time_s=[rng.uniform(0, 3) for _ in range(pp)],
        extra_bytes=[rng.uniform(0, 3) for _ in range(pp)],
        in_flight=[rng.choice([1.5, 1, 2.5]) for _ in range(pp)],
        p2p_s=rng.uniform(0, 0.3),
        capacity_bytes=rng.uniform(6, 30),
        virtual_stages=v,
        cut_s=_random_cuts(rng, layers) if cuts else None,
    )


@pytest.mark.parametrize("cuts", [False, True])
@pytest.mark.parametrize("seed", range(40))
def test_interleaved_ilp_equals_brute_force(seed, cuts):
    problem = _random_interleaved(random.Random(seed), uniform=False, cuts=cuts)
    found, ilp, brute = partition(problem), partition_ilp(problem), partition_brute_force(problem)
    if brute is None:
        assert found is None and ilp is None
        return
    assert _value(ilp) == pytest.approx(brute.max_stage_time_s, rel=1e-7)
    assert _value(found) == pytest.approx(brute.max_stage_time_s, rel=1e-7)
    assert problem.evaluate(found.bounds) == pytest.approx(found.max_stage_time_s)


@pytest.mark.parametrize("seed", range(40))
def test_interleaved_identical_layers_greedy_equals_brute_force(seed):
    problem = _random_interleaved(random.Random(1000 + seed), uniform=True)
    found, brute = partition(problem), partition_brute_force(problem)
    if brute is None:
        assert found is None
        return
    assert _value(found) == pytest.approx(brute.max_stage_time_s, rel=1e-9)
    assert problem.evaluate(found.bounds) == pytest.approx(found.max_stage_time_s)


@pytest.mark.parametrize("seed", range(40))
def test_identical_layers_one_chunk_per_stage_greedy_equals_dp_and_brute_force(seed):
    problem = _random_interleaved(random.Random(2000 + seed), uniform=True, v=1)
    found, dp, brute = partition(problem), _partition_dp(problem), partition_brute_force(problem)
    if brute is None:
        assert found is None and dp is None
        return
    assert _value(found) == pytest.approx(brute.max_stage_time_s, rel=1e-9)
    assert _value(dp) == pytest.approx(brute.max_stage_time_s, rel=1e-9)


def test_identical_layers_with_unlike_cuts_leave_the_greedy_and_cut_at_the_small_tensor():
    # four equal layers on two stages: the even cut (after layer 2) sends a big tensor, the cut
    # after layer 1 a small one; the DP takes the uneven split when the saved send pays for it
    cuts = [0.0, 0.1, 3.0, 0.1, 0.0]
    problem = PartitionProblem(
        [1.0] * 4, [0.0] * 4, [0.0] * 4, 2, [0.0] * 2, [0.0] * 2, [1.0] * 2, 3.0, 1.0, cut_s=cuts
    )
    found = partition(problem)
    assert found.bounds in ([0, 1, 4], [0, 3, 4]) and found.max_stage_time_s == pytest.approx(3.1)
    assert found.max_stage_time_s == partition_brute_force(problem).max_stage_time_s
    assert problem.evaluate([0, 2, 4]) == pytest.approx(5.0)


def test_cut_times_need_one_entry_per_boundary():
    with pytest.raises(ValueError, match="one per boundary"):
        PartitionProblem([1.0] * 3, [0.0] * 3, [0.0] * 3, 2, [0.0] * 2, [0.0] * 2, [1.0] * 2, 0.0, 1.0, cut_s=[0.0])


def _interleaved(layers, pp, v, *, extra_time_s, in_flight, activation=0.0, capacity=float("inf")):
    return PartitionProblem(
        [1.0] * layers,
        [0.0] * layers,
        [activation] * layers,
        pp,
        extra_time_s,
        [0.0] * pp,
        in_flight,
        0.0,
        capacity,
        virtual_stages=v,
    )


def test_interleaved_head_takes_the_place_of_layers_on_the_last_stage():
    # 14 layers, pp=4, v=2, the head's 2 s on stage 3: even chunks give stage 3 three layers (5 s);
    # the optimum gives it two and every other stage four (4 s)
    problem = _interleaved(14, 4, 2, extra_time_s=[0.0, 0.0, 0.0, 2.0], in_flight=[1.0] * 4)
    found = partition(problem)
    assert problem.evaluate([0, 2, 4, 6, 8, 10, 12, 13, 14]) == pytest.approx(5.0)
    assert found.max_stage_time_s == pytest.approx(4.0)
    sizes = [j - i for i, j in zip(found.bounds, found.bounds[1:])]
    assert [sizes[k] + sizes[k + 4] for k in range(4)] == [4, 4, 4, 2]


def test_interleaved_memory_limit_moves_layers_off_the_first_stage():
    # stage 0 holds 2 micro-batches of its activations, stage 1 one; time alone would put 4 layers on each
    problem = _interleaved(8, 2, 2, extra_time_s=[0.0, 0.0], in_flight=[2.0, 1.0], activation=1.0, capacity=6.0)
    found = partition(problem)
    sizes = [j - i for i, j in zip(found.bounds, found.bounds[1:])]
    assert sizes[0] + sizes[2] == 3 and sizes[1] + sizes[3] == 5
    assert (
        partition(_interleaved(8, 2, 2, extra_time_s=[0.0, 0.0], in_flight=[2.0, 1.0], activation=1.0, capacity=3.0))
        is None
    )


def test_interleaved_mixed_layers_beyond_the_ilp_limit_beat_even_chunks():
    # two kinds of layer in runs of 4, 48 layers on pp=4, v=3: the ILP is stopped early, and the
    # answer (its incumbent or the fill) is a valid partition no slower than even chunks
    layers, pp = 48, 4
    times = [1.0 if (i // 4) % 2 == 0 else 1.7 for i in range(layers)]
    problem = PartitionProblem(
        times,
        [1.0] * layers,
        [0.5] * layers,
        pp,
        [1.3, 0.0, 0.0, 4.1],
        [0.0] * pp,
        [1.0] * pp,
        0.01,
        float("inf"),
        virtual_stages=3,
    )
    found = partition(problem, time_limit_s=0.2)
    assert len(found.bounds) == 13 and problem.evaluate(found.bounds) == pytest.approx(found.max_stage_time_s)
    assert found.max_stage_time_s < problem.evaluate(list(range(0, 49, 4)))
    assert found.max_stage_time_s >= (sum(times) + 5.4) / pp
