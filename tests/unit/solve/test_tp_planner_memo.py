"""TPPlanner keeps a block's prices and its ILP's answer on what they read (solve/tp_plan.py): budgets that differ
only in another block's byte limit solve the blocks they share once, and every choice is the one a fresh planner
makes, whatever the limits and factors the keys hold apart."""

from synthetic import synthetic_gpt, synthetic_profile

from autoplan.cost import MemoryBudget, price_block, split_context
from autoplan.solve.intra_op import solve_block
from autoplan.solve.tp_plan import TPPlanner

CHOICE = dict(dp=1, tp=4, pp=1, sequence_parallel=False, precision="bf16", micro_batch_size=8)
FACTORS = dict(param_bytes_factor=4.0, activation_factor=0.5)


def _limits(graph, profile) -> tuple[float, list[float]]:
    """The outside nodes' bytes at their fastest splits, and block limits from loose to past the lightest splits."""
    ctx = split_context(graph, profile, dp=1, tp=4, pp=1, sequence_parallel=False, precision="bf16", micro_batch_size=8)
    outside, block = (price_block(graph, rep, ctx=ctx, **FACTORS) for rep in (None, "h.0"))
    fastest = solve_block(block).memory_bytes
    lightest = block.min_memory_bytes()
    return solve_block(outside).memory_bytes, [fastest * 2, fastest, (fastest + lightest) / 2, lightest]


def test_budgets_apart_in_one_block_limit_solve_the_rest_once():
    graph, profile = synthetic_gpt(layers=2, seq=256, batch=16, vocab=4096), synthetic_profile()
    outside_bytes, limits = _limits(graph, profile)
    planner = TPPlanner(graph, profile)
    solved = []
    for factors in (FACTORS, {**FACTORS, "activation_factor": 0.25}):  # other factors: every block priced again
        for limit in limits:
            budget = MemoryBudget(block_bytes=limit, outside_bytes=outside_bytes * 2, **factors)
            before = planner.solves
            choice = planner.choose(**CHOICE, budget=budget)
            fresh = TPPlanner(graph, profile).choose(**CHOICE, budget=budget)
            assert (choice.feasible, dict(choice.tp_plan)) == (fresh.feasible, dict(fresh.tp_plan)), (factors, limit)
            solved.append(planner.solves - before)
    # the outside nodes' ILP once per outside limit, each block limit's once: without the memo, two per budget
    assert solved == [2, 1, 1, 1] * 2, solved
    budgets = [MemoryBudget(block_bytes=limit, outside_bytes=outside_bytes * 2, **FACTORS) for limit in limits]
    answers = {frozenset(planner.choose(**CHOICE, budget=budget).tp_plan.items()) for budget in budgets}
    assert len(answers) > 1  # the limits bind: the memo must not hand one budget's splits to another
