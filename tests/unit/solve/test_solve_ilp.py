"""The intra-op ILP finds the brute-force optimum under the same cost terms; the backend reports honestly."""

import pulp
import pytest
from synthetic import synthetic_gpt, synthetic_profile

from autoplan.cost import price_block
from autoplan.cost.network.mesh import mesh_groups
from autoplan.cost.tp.splits import TPContext
from autoplan.solve import backend
from autoplan.solve.intra_op import brute_force_block, solve_block

CASES = [
    dict(hidden=512, heads=8),  # plain MHA
    dict(hidden=384, heads=6),  # 6 heads: no head split at tp=4
    dict(hidden=512, heads=8, kv_heads=2),  # GQA
    dict(hidden=512, heads=8, fused_qkv=True),  # fused qkv (gathered colwise)
]


def _problem(case, *, tp, sp, mbs, layer="h.0", profile=None, **factors):
    profile = profile or synthetic_profile()
    graph = synthetic_gpt(layers=2, seq=256, batch=16, vocab=4096, **case)
    ctx = TPContext(
        profile=profile,
        tp=tp,
        group=mesh_groups(profile, dp=1, tp=tp, pp=1)["tp"],
        sequence_parallel=sp,
        precision="bf16",
        batch_fraction=mbs / 16,
    )
    return price_block(graph, layer, ctx=ctx, **factors)


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("tp, sp, mbs", [(2, False, 1), (4, True, 4), (8, False, 16)])
def test_ilp_equals_brute_force(case, tp, sp, mbs):
    for layer in ("h.0", None):
        problem = _problem(case, tp=tp, sp=sp, mbs=mbs, layer=layer)
        solution = solve_block(problem)
        best = brute_force_block(problem)
        assert solution.status.status == "optimal" and solution.status.gap == 0.0
        assert solution.time_s == pytest.approx(best[1], rel=1e-7)
        assert problem.respects_ties(solution.splits)


@pytest.mark.parametrize("case", CASES[:2])
def test_ilp_equals_brute_force_under_a_memory_budget(case):
    slow_links = synthetic_profile(intra_busbw_bytes_per_s=5e9)  # comm dear: unconstrained optimum replicates
    problem = _problem(case, tp=4, sp=False, mbs=8, profile=slow_links, param_bytes_factor=4.0, activation_factor=1.0)
    free = solve_block(problem)
    lightest = min(problem.evaluate(dict(zip(problem.params, combo)))[1] for combo in _combos(problem))
    budget = (lightest + free.memory_bytes) / 2
    assert free.memory_bytes > budget  # the budget binds
    solution = solve_block(problem, memory_budget_bytes=budget)
    best = brute_force_block(problem, memory_budget_bytes=budget)
    assert solution.memory_bytes <= budget + 1e-6
    assert solution.time_s == pytest.approx(best[1], rel=1e-7)
    assert solution.time_s > free.time_s
    assert solve_block(problem, memory_budget_bytes=lightest * 0.5) is None
    assert brute_force_block(problem, memory_budget_bytes=lightest * 0.5) is None


def _combos(problem):
    import itertools

    return itertools.product(*(problem.legal[v] for v in problem.params))


def test_tied_embedding_and_head_shard_the_same_weight_dim():
    problem = _problem(CASES[0], tp=4, sp=False, mbs=16, layer=None)
    problem.dim_ties.append(("wte", "head", "embedding", "linear"))  # as a tied model would have
    splits = solve_block(problem).splits
    pairs = {("replicate", "replicate"), ("rowwise", "colwise"), ("colwise", "rowwise")}
    assert (splits["wte"], splits["head"]) in pairs


def test_cbc_fallback_finds_the_same_optimum():
    problem = _problem(CASES[0], tp=4, sp=True, mbs=4)
    highs, cbc = solve_block(problem, solver="highs"), solve_block(problem, solver="cbc")
    assert cbc.status.solver == "cbc" and highs.status.solver == "highs"
    assert cbc.time_s == pytest.approx(highs.time_s, rel=1e-7)


class _StoppedAtLimit(pulp.LpProblem):
    """PuLP says 'Optimal' (status 1) after a time limit; only sol_status tells the truth."""

    def solve(self, solver=None, **kwargs):
        self.status, self.sol_status = pulp.LpStatusOptimal, pulp.LpSolutionIntegerFeasible
        return self.status


def test_backend_tells_time_limit_from_optimal():
    model = _StoppedAtLimit("x", pulp.LpMinimize)
    x = backend.variable(model, "x", low=0, up=1, cat="Binary")
    model += x
    assert backend.solve_model(model, time_limit_s=1).status == "time_limit"
    real = pulp.LpProblem("y", pulp.LpMinimize)
    y = backend.variable(real, "y", low=0, up=1, cat="Binary")
    real += y
    real += y >= 1
    status = backend.solve_model(real, time_limit_s=5)
    assert (status.status, status.gap, status.objective) == ("optimal", 0.0, 1.0)
    infeasible = pulp.LpProblem("z", pulp.LpMinimize)
    z = backend.variable(infeasible, "z", low=0, up=1, cat="Binary")
    infeasible += z
    infeasible += z >= 2
    assert backend.solve_model(infeasible, time_limit_s=5).status == "infeasible"


@pytest.mark.parametrize("case", CASES)
def test_ilp_objective_is_what_the_cost_model_charges(case):
    """The ILP prices a block exactly as autoplan.cost.blocks.summarise (what CostModel sums) does:
    op times with the bytes each op reads, TP comm, and saved bytes with their shards."""
    import itertools

    from autoplan.cost.blocks import block_structure, summarise

    profile = synthetic_profile()
    graph = synthetic_gpt(layers=2, seq=256, batch=16, vocab=4096, **case)
    ctx = TPContext(
        profile=profile,
        tp=4,
        group=mesh_groups(profile, dp=1, tp=4, pp=1)["tp"],
        sequence_parallel=True,
        precision="bf16",
        batch_fraction=2 / 16,
    )
    problem = price_block(graph, "h.0", ctx=ctx, forward_repeats=2, activation_factor=2 / 16)
    for combo in itertools.islice(itertools.product(*(problem.legal[v] for v in problem.params)), 0, None, 7):
        splits = dict(zip(problem.params, combo))
        tp_plan = {graph.node(v).module: s for v, s in splits.items()}
        block = summarise(graph, block_structure(graph, "h.0"), layer="h.0", tp_plan=tp_plan, ctx=ctx)
        time_s, memory = problem.evaluate(splits)
        assert time_s == pytest.approx(2 * block.fwd_s + block.bwd_s + 2 * block.tp_fwd_s + block.tp_bwd_s, rel=1e-9)
        assert memory == pytest.approx(block.saved_bytes, rel=1e-9)


@pytest.mark.parametrize("budget", [float("nan"), -1.0, float("-inf")])
def test_impossible_budget_is_infeasible_with_a_reason_never_a_solver_crash(budget):
    # PuLP raises "Cannot set constraint RHS to NaN/inf" if such a budget reaches it.
    from autoplan.cost import MemoryBudget
    from autoplan.solve.intra_op import budget_infeasibility
    from autoplan.solve.tp_plan import TPPlanner

    problem = _problem(CASES[0], tp=4, sp=False, mbs=8, param_bytes_factor=4.0, activation_factor=1.0)
    assert solve_block(problem, memory_budget_bytes=budget) is None
    assert budget_infeasibility(problem, budget)
    graph = synthetic_gpt(layers=2, seq=256, batch=16, vocab=4096)
    planner = TPPlanner(graph, synthetic_profile())
    choice = planner.choose(
        dp=1,
        tp=4,
        pp=1,
        sequence_parallel=False,
        precision="bf16",
        micro_batch_size=8,
        budget=MemoryBudget(block_bytes=budget, outside_bytes=2**40, param_bytes_factor=4.0, activation_factor=0.5),
    )
    assert not choice.feasible and choice.status == "infeasible"
    assert "tp ILP infeasible at tp=4" in choice.reason and "budget" in choice.reason


def test_unlimited_budget_is_no_row_and_infinite_bytes_are_refused():
    problem = _problem(CASES[0], tp=4, sp=False, mbs=8, param_bytes_factor=4.0, activation_factor=1.0)
    assert solve_block(problem, memory_budget_bytes=float("inf")).time_s == pytest.approx(solve_block(problem).time_s)
    broken = _problem(CASES[0], tp=4, sp=False, mbs=8, param_bytes_factor=float("inf"), activation_factor=1.0)
    assert solve_block(broken, memory_budget_bytes=2**40) is None


def _option(model: pulp.LpProblem, name: str):
    answer = model.solverModel.getOptionValue(name)
    return answer[1] if isinstance(answer, tuple) else answer  # highspy >= 1.12: (status, value)


@pytest.mark.parametrize("case", CASES)
def test_highs_runs_without_feasibility_jump_and_finds_the_same_splits(case, monkeypatch):
    """solve/backend.py, HIGHS_OPTIONS: the heuristic is off in the solver the planner runs, and every intra-op
    ILP here (four shapes, three tp/sp/micro-batch points, one block and the rest) chooses the same splits at
    the same price as HiGHS with its defaults."""
    used, solver = backend.make_solver("highs", time_limit_s=10)
    model = pulp.LpProblem("one", pulp.LpMinimize)
    x = backend.variable(model, "x", low=0, up=1, cat="Binary")
    model += x
    model += x >= 1
    model.solve(solver)
    assert used == "highs" and _option(model, "mip_heuristic_run_feasibility_jump") is False
    problems = [
        _problem(case, tp=tp, sp=sp, mbs=mbs, layer=layer)
        for tp, sp, mbs in [(2, False, 1), (4, True, 4), (8, False, 16)]
        for layer in ("h.0", None)
    ]
    planned = [solve_block(problem) for problem in problems]
    monkeypatch.setattr(backend, "HIGHS_OPTIONS", {})
    defaults = [solve_block(problem) for problem in problems]
    assert [(s.splits, s.time_s, s.memory_bytes) for s in planned] == [
        (s.splits, s.time_s, s.memory_bytes) for s in defaults
    ]
