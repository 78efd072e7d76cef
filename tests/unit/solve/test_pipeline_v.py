"""The V placement's partition (solve/partition_v.py) is exact: on random V problems with unlike layers, cuts of
random sizes and memory limits that bind, it returns brute force's optimum bit for bit, and None exactly where no
partition fits; the search with a V schedule pinned on a model of unlike blocks picks the same plan, at the same
price, as with the ILP it replaces run to proven optimality."""

from __future__ import annotations

import itertools
import random
from pathlib import Path

import pytest

import autoplan.solve.partition_v as partition_v_module
import autoplan.solve.pipeline as pipeline
from autoplan.profile import load_profile
from autoplan.solve.api import plan_graph
from autoplan.solve.partition_v import partition_v
from autoplan.solve.pipeline import PartitionProblem, partition, partition_brute_force, partition_ilp
from autoplan.solve.stage_costs import StageCosts
from autoplan.trace import trace_model_file

INF = float("inf")
ODD = Path(__file__).resolve().parents[2] / "odd_models"


def _random_v(rng: random.Random, *, limited: bool) -> PartitionProblem:
    pp = rng.randint(1, 4)
    layers = rng.randint(2 * pp, min(12, 2 * pp + 5))
    static = [rng.uniform(1, 3) for _ in range(layers)]
    return PartitionProblem(
        layer_time_s=[rng.uniform(0.2, 2.0) for _ in range(layers)],
        layer_static_bytes=static,
        layer_activation_bytes=[rng.uniform(0, 2) for _ in range(layers)],
        pp=pp,
        extra_time_s=[rng.uniform(0, 3) for _ in range(pp)],
        extra_bytes=[rng.uniform(0, 3) for _ in range(pp)],
        in_flight=[rng.choice([2 * (pp - k) - 1, 1, 3]) for k in range(pp)],
        p2p_s=0.0,
        capacity_bytes=rng.uniform(1.2, 3.5) * sum(static) / pp if limited else INF,
        virtual_stages=2,
        cut_s=[rng.uniform(0, 0.6) for _ in range(layers + 1)],
        v_shape=True,
    )


@pytest.mark.parametrize("limited", [False, True])
@pytest.mark.parametrize("seed", range(60))
def test_v_partition_equals_brute_force(seed, limited):
    problem = _random_v(random.Random(seed), limited=limited)
    found, brute = partition_v(problem), partition_brute_force(problem)
    if brute is None:
        assert found is None and partition(problem) is None
        return
    assert found.max_stage_time_s == brute.max_stage_time_s  # the same sums in the same order
    assert problem.evaluate(found.bounds) == found.max_stage_time_s
    assert partition(problem).max_stage_time_s == brute.max_stage_time_s


def _tied_v(rng: random.Random, *, limited: bool) -> PartitionProblem:
    """A larger V problem of whole-number times, so many partitions tie and the tie-break shows."""
    pp = rng.randint(2, 5)
    layers = rng.randint(2 * pp + 2, 2 * pp + 14)
    static = [float(rng.randint(1, 3)) for _ in range(layers)]
    return PartitionProblem(
        layer_time_s=[float(rng.randint(1, 3)) for _ in range(layers)],
        layer_static_bytes=static,
        layer_activation_bytes=[float(rng.randint(0, 2)) for _ in range(layers)],
        pp=pp,
        extra_time_s=[float(rng.randint(0, 3)) for _ in range(pp)],
        extra_bytes=[float(rng.randint(0, 3)) for _ in range(pp)],
        in_flight=[rng.choice([2 * (pp - k) - 1, 1, 3]) for k in range(pp)],
        p2p_s=0.0,
        capacity_bytes=rng.uniform(1.5, 3.5) * sum(static) / pp if limited else INF,
        virtual_stages=2,
        cut_s=[float(rng.randint(0, 1)) for _ in range(layers + 1)],
        v_shape=True,
    )


@pytest.mark.parametrize("limited", [False, True])
@pytest.mark.parametrize("seed", range(40))
def test_the_ceiling_changes_no_answer(seed, limited, monkeypatch):
    """Pruned to a ceiling (the best of the hints and even chunks), the DP returns the unpruned DP's bounds and
    value bit for bit, ties split alike, whatever the hints: none, the optimum itself, or another partition."""
    rng = random.Random(seed)
    problem = (_tied_v if seed % 2 else _random_v)(rng, limited=limited)
    with monkeypatch.context() as patch:
        patch.setattr(partition_v_module, "_ceiling", lambda *args: INF)
        unpruned = partition_v(problem)
    other = [0, *sorted(rng.sample(range(1, problem.layers), 2 * problem.pp - 1)), problem.layers]
    for hints in ([], [other], [unpruned.bounds] if unpruned else [], [other, other[::-1]]):
        found = partition_v(problem, hints=hints)
        assert (found is None) == (unpruned is None)
        if found is not None:
            assert (found.bounds, found.max_stage_time_s) == (unpruned.bounds, unpruned.max_stage_time_s)


def test_a_ceiling_at_the_optimum_steps_only_the_pairs_left(monkeypatch):
    """With the optimum as the ceiling every stage steps the few pairs left as one array (the sparse step); with
    none, every stage steps all pairs per x' (the dense step); the answers are the same."""
    problem = _tied_v(random.Random(3), limited=False)
    best = partition_v(problem)
    sparse, dense = partition_v_module._sparse_step, partition_v_module._dense_step
    for ceiling, kind in ((best.max_stage_time_s, "sparse"), (INF, "dense")):
        steps = []
        with monkeypatch.context() as patch:
            patch.setattr(partition_v_module, "_ceiling", lambda *args: ceiling)
            patch.setattr(partition_v_module, "_sparse_step", lambda *a: steps.append("sparse") or sparse(*a))
            patch.setattr(partition_v_module, "_dense_step", lambda *a: steps.append("dense") or dense(*a))
            found = partition_v(problem)
        assert steps == [kind] * problem.pp
        assert (found.bounds, found.max_stage_time_s) == (best.bounds, best.max_stage_time_s)


def test_the_random_v_problems_include_binding_memory_and_infeasible_ones():
    """The cases above test what they claim: some limits move the optimum, some leave no partition."""
    moved = infeasible = 0
    for seed in range(60):
        problem = _random_v(random.Random(seed), limited=True)
        brute = partition_brute_force(problem)
        free = partition_brute_force(_random_v(random.Random(seed), limited=False))
        infeasible += brute is None
        moved += brute is not None and brute.max_stage_time_s > free.max_stage_time_s
    assert moved >= 5 and infeasible >= 5


def test_the_turn_and_the_ends_pay_no_cut():
    """Stage 0 holds the first and the last chunk and the last stage the V's turn: a cut there is never sent, so
    the cuts priced are those of the four boundaries between stages (pp = 2, one layer per chunk)."""
    cuts, none = [9.0, 1.0, 5.0, 2.0, 9.0], [0.0] * 4
    problem = PartitionProblem([1.0] * 4, none, none, 2, [0.0] * 2, [0.0] * 2, [1.0] * 2, 0.0, INF, 2, cuts, True)
    found = partition_v(problem)
    assert found.bounds == [0, 1, 2, 3, 4]
    assert found.max_stage_time_s == 2.0 + 1.0 + 2.0  # stage 0: two layers, its send at 1 and receive at 3


def test_v_partition_refuses_other_placements():
    problem = _random_v(random.Random(0), limited=False)
    problem.v_shape = False
    with pytest.raises(ValueError, match="V placement only"):
        partition_v(problem)


@pytest.fixture(scope="module")
def funnel():
    return trace_model_file(ODD / "mixed_blocks.py", 8)


@pytest.mark.parametrize("schedule", ["zbv", "dualpipev"])
def test_the_search_with_a_v_pinned_picks_what_the_proven_ilp_picks(funnel, monkeypatch, schedule):
    fix = f"pp=2,schedule={schedule},precision=fp32"
    result = plan_graph(funnel, devices=2, profile="cpu-gloo", fix=fix)
    plan = result.best
    problem = StageCosts(funnel, load_profile("cpu-gloo")).problem(plan)
    best = partition_brute_force(problem)
    assert len(set(problem.layer_time_s)) > 2 and len(plan.stages) == 4
    assert [len(chunk) for chunk in plan.stages] == [j - i for i, j in zip(best.bounds, best.bounds[1:])]
    monkeypatch.setattr(pipeline, "partition_v", lambda p, **_: partition_ilp(p, time_limit_s=60.0))
    with_ilp = plan_graph(funnel, devices=2, profile="cpu-gloo", fix=fix)
    assert with_ilp.best.describe() == plan.describe()
    assert with_ilp.best_cost.step_time_s == result.best_cost.step_time_s
    ilp_bounds = [0, *itertools.accumulate(len(chunk) for chunk in with_ilp.best.stages)]
    assert problem.evaluate(ilp_bounds) == best.max_stage_time_s  # the two may split a tie differently


@pytest.mark.parametrize("seed", range(12))
def test_spans_and_rooms_kept_on_a_problem_serve_every_ceiling(seed):
    """The layers' spans and each stage's room (kept on the problem per stage and ceiling) give, under ceilings from
    several hints, what a fresh copy of the problem gives: the room reads the ceiling, the spans none."""
    rng = random.Random(seed)
    problem = (_tied_v if seed % 2 else _random_v)(rng, limited=bool(seed % 3))
    other = [0, *sorted(rng.sample(range(1, problem.layers), 2 * problem.pp - 1)), problem.layers]
    for hints in ([other], [], [other[::-1]]):
        fresh = partition_v(_copy(problem), hints=hints)
        found = partition_v(problem, hints=hints)
        assert (found is None) == (fresh is None)
        if found is not None:
            assert (found.bounds, found.max_stage_time_s) == (fresh.bounds, fresh.max_stage_time_s)
    assert "_v_spans" in problem.__dict__
    assert all(0 < k < problem.pp for k, _ in problem.__dict__.get("_v_rooms", {}))


def _copy(problem: PartitionProblem) -> PartitionProblem:
    fields = ("layer_time_s", "layer_static_bytes", "layer_activation_bytes", "pp", "extra_time_s", "extra_bytes")
    fields += ("in_flight", "p2p_s", "capacity_bytes", "virtual_stages", "cut_s", "v_shape")
    return PartitionProblem(**{name: getattr(problem, name) for name in fields})
