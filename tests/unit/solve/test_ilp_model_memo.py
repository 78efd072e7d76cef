"""TPPlanner hands solve_block a memo of HiGHS's answers (solve/linear.py ``solve``): prices that differ only in what
the model does not read (a constant, or bytes where no budget adds the memory row) run HiGHS once, and each answer is
the one solve_block gives without the memo, its objective summed from its own constant."""

import dataclasses
import sys

from synthetic import synthetic_gpt, synthetic_profile

from autoplan.cost import price_block, split_context
from autoplan.solve import linear
from autoplan.solve.intra_op import solve_block
from autoplan.solve.tp_plan import TPPlanner

CTX = dict(dp=1, tp=4, pp=1, sequence_parallel=False, precision="bf16", micro_batch_size=8)


def _answer(solution) -> tuple:
    return solution.splits, solution.time_s, solution.memory_bytes, solution.status.status, solution.status.objective


def test_prices_apart_in_what_the_model_does_not_read_run_highs_once(monkeypatch):
    graph, profile = synthetic_gpt(layers=2, seq=256, batch=16, vocab=4096), synthetic_profile()
    problem = price_block(graph, "h.0", ctx=split_context(graph, profile, **CTX), param_bytes_factor=4.0)
    heavier = {v: {s: b * 1.2 for s, b in table.items()} for v, table in problem.unary_bytes.items()}
    v = problem.params[0]
    slower = {**problem.unary_s, v: {s: t * 1.5 + 1e-4 for s, t in problem.unary_s[v].items()}}
    budget = problem.min_memory_bytes() * 2
    cases = [  # (prices, budget, whether HiGHS runs)
        (problem, None, True),
        (dataclasses.replace(problem, constant_s=problem.constant_s + 1.0), None, False),  # the objective's constant
        (dataclasses.replace(problem, unary_bytes=heavier, constant_bytes=7.0), None, False),  # bytes, no memory row
        (dataclasses.replace(problem, unary_s=slower), None, True),  # a cost
        (problem, budget, True),  # the memory row
        (dataclasses.replace(problem, unary_bytes=heavier), budget, True),  # its coefficients
    ]
    plain = [_answer(solve_block(prices, memory_budget_bytes=limit)) for prices, limit, _ in cases]
    runs, build = [], linear.highs_model
    monkeypatch.setattr(linear, "highs_model", lambda *a, **k: runs.append(1) or build(*a, **k))
    memo = {}
    for (prices, limit, solved), answer in zip(cases, plain):
        before = len(runs)
        assert _answer(solve_block(prices, memory_budget_bytes=limit, memo=memo)) == answer
        assert len(runs) - before == solved
    assert plain[1][4] != plain[0][4] and plain[2][2] != plain[0][2]  # the reused answers' own objective and bytes


def test_solves_are_counted_where_pulp_runs_them_without_highspy(monkeypatch):
    """Without highspy, solver "highs" runs through PuLP, which keeps no memo: each distinct ILP still counts once
    (plan.json's ``ilp_solves``), as many as where HiGHS runs and keeps them."""
    graph, profile = synthetic_gpt(layers=2, seq=256, batch=16, vocab=4096), synthetic_profile()
    with_highspy = TPPlanner(graph, profile)
    with_highspy.choose(**CTX)
    monkeypatch.setitem(sys.modules, "highspy", None)  # its import raises ImportError
    assert not linear.memoises("highs")
    without = TPPlanner(graph, profile)
    without.choose(**CTX)
    assert without.solves == with_highspy.solves > 0
