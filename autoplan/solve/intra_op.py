"""The intra-operator ILP: one split per parameterised op of a block (Alpa, OSDI'22, section 4.2;
docs/ilp.md, section 2). Terms from autoplan.cost.tp.splits, priced as CostModel prices them
(cost/compute/op_costs.py), so the objective and memory row equal what CostModel charges the block.

    x[v,s] in {0,1}      v parameterised, s in legal_splits(v, tp);  sum_s x[v,s] = 1     (a)
    e[u,v,a,c] in [0,1]  per edge/sibling pair;  sum_c e = x[u,a],  sum_a e = x[v,c]      (b)
    y[k] in [0,1]        per any-of term k;       y[k] >= x[v,s] for each (v,s) of k       (c)
    g[k] in [0,1]        per gated term k (w,s_w); g[k] >= x[w,s_w] + x[v,s] - 1             (c')
    z[n,L] in [0,1]      per pure node n and layout L in {S, Q} its origins allow (any sharded origin
                         shards it, DTensor's propagation: cost/tp/shards.py);
                         z[n,S] <= sum_u x[u,colwise], z[n,Q] <= sum_u x[u,rowwise], z[n,S] + z[n,Q] <= 1  (d)
    ties                 x[u,s] = x[w,s] (one module); equal shard dims (shared parameter)  (e)
    memory               sum bytes(v,s) x + sum_n (act_R(n) - sum_L (act_R - act_L)(n) z[n,L]) + const <= budget  (f)
    minimise  sum x[v,s] (compute(v,s) + unary_comm(v,s) + step(v,s)) + sum e pair_comm + sum y anyof_comm
              + sum_n (t_R(n) - sum_L (t_R(n) - t_L(n)) z[n,L]) + constants      (s per micro-batch)

step(v,s) (``BlockPrices.step_s``, 0 where not given): v's parameters' dp messages and optimizer step once a step
at split s, over the m micro-batches (cost/dp/param_step.py); :func:`objective_s` evaluates the whole objective.

(b) forces e = x[u,a] x[v,c] at 0/1 marginals (linearising the resharding term); (c) and (d) are
exact at the optimum. The forward counts ``forward_repeats`` times (2 under full recomputation).
A NaN, negative or too-small budget is infeasible before any solve (:func:`budget_infeasibility`).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

from autoplan.cost import BlockPrices, shard_dim
from autoplan.solve.backend import SolveStatus
from autoplan.solve.linear import LinearModel, solve


# ---- the ILP -----------------------------------------------------------------------------
@dataclass
class BlockSolution:
    splits: dict[str, str]
    time_s: float
    memory_bytes: float
    status: SolveStatus


def solve_block(
    problem: BlockPrices,
    *,
    memory_budget_bytes: float | None = None,
    solver: str = "highs",
    time_limit_s: float = 10.0,
    memo: dict | None = None,
) -> BlockSolution | None:
    """The split of each parameterised op minimising the block's time within the budget;
    None when no assignment fits the budget (:func:`budget_infeasibility` says why). ``memo``: solve/linear.py
    ``solve``'s (prices apart only in what the model does not read, bytes without a budget or a constant, run once)."""
    if memory_budget_bytes is not None and math.isinf(memory_budget_bytes) and memory_budget_bytes > 0:
        memory_budget_bytes = None  # an unlimited budget is no row at all
    if memory_budget_bytes is not None and budget_infeasibility(problem, memory_budget_bytes):
        return None
    model = LinearModel()
    x = {
        (v, s): model.column(f"x{i}_{j}", integer=True)
        for i, v in enumerate(problem.params)
        for j, s in enumerate(problem.legal[v])
    }
    objective: list[tuple[str, float]] = []
    memory: list[tuple[str, float]] = []
    memory_constant = [problem.constant_bytes]  # summed in PuLP's order, for the row's bound (solve/linear.py)
    objective_constant = [problem.constant_s]
    for v in problem.params:
        model.row([(x[v, s], 1) for s in problem.legal[v]], low=1, up=1)  # (a)
        step = problem.step_s.get(v, {})
        objective += [(x[v, s], problem.unary_s[v][s] + step.get(s, 0.0)) for s in problem.legal[v]]
        memory += [(x[v, s], problem.unary_bytes[v][s]) for s in problem.legal[v]]
    _add_pairs(model, problem, x, objective)
    _add_any_of(model, problem, x, objective)
    _add_gated(model, problem, x, objective)
    _add_pure(model, problem, x, objective, memory, (objective_constant, memory_constant))
    _add_tie_rows(model, problem, x)
    if memory_budget_bytes is not None:
        model.row(memory, up=-(_pulp_sum(memory_constant) - memory_budget_bytes))  # (f)
    model.minimise(objective, _pulp_sum(objective_constant))
    status, values = solve(model, solver=solver, time_limit_s=time_limit_s, memo=memo)
    if not status.has_solution:
        return None
    splits = {v: max(problem.legal[v], key=lambda s: values[x[v, s]] or 0.0) for v in problem.params}
    time_s, memory_bytes = problem.evaluate(splits)
    return BlockSolution(splits=splits, time_s=time_s, memory_bytes=memory_bytes, status=status)


def objective_s(problem: BlockPrices, splits: dict[str, str]) -> float:
    """The ILP's objective at ``splits``: the block's seconds (``BlockPrices.evaluate``) and their step term."""
    step_s = sum(problem.step_s.get(v, {}).get(splits[v], 0.0) for v in problem.params)
    return problem.evaluate(splits)[0] + step_s


def _pulp_sum(numbers: list[float]) -> float:
    """The numbers summed left to right from 0, as ``pulp.lpSum`` sums an expression's constants."""
    total = 0
    for number in numbers:
        total += number
    return total


def budget_infeasibility(problem: BlockPrices, memory_budget_bytes: float) -> str:
    """Why no split can meet ``memory_budget_bytes`` before any solve ('' when one may): a budget
    that is not a number or is negative, bytes that are not finite, or a budget below the
    lightest split of every op. PuLP cannot take a NaN/inf right-hand side, so these never reach it."""
    if math.isnan(memory_budget_bytes) or memory_budget_bytes < 0:
        return (
            f"the per-block memory budget is {memory_budget_bytes / 2**30:.3g} GiB "
            "(the rest of the device memory leaves nothing for the blocks)"
        )
    lightest = problem.min_memory_bytes()
    coefficients = [b for table in problem.unary_bytes.values() for b in table.values()]
    coefficients += [b for pure in problem.pure.values() for b in pure.bytes.values()]
    if not all(math.isfinite(b) for b in [lightest, *coefficients]):
        return "the block's bytes are not finite; the parameter or activation byte factors are invalid"
    if lightest > memory_budget_bytes:
        return (
            f"the lightest splits need {lightest / 2**30:.3g} GiB per block, "
            f"over the {memory_budget_bytes / 2**30:.3g} GiB budget"
        )
    return ""


def _add_pairs(model: LinearModel, problem: BlockPrices, x, objective) -> None:
    r = problem.forward_repeats
    for k, ((u, v), table) in enumerate(problem.terms.pair.items()):
        if not any(f or b for f, b in table.values()):
            continue
        e = {(a, c): model.column(f"e{k}_{i}") for i, (a, c) in enumerate(table)}
        for a in problem.legal[u]:  # (b)
            model.row([*((e[a, c], 1) for c in problem.legal[v]), (x[u, a], -1)], low=0, up=0)
        for c in problem.legal[v]:
            model.row([*((e[a, c], 1) for a in problem.legal[u]), (x[v, c], -1)], low=0, up=0)
        objective += [(e[key], r * f + b) for key, (f, b) in table.items() if f or b]


def _add_any_of(model: LinearModel, problem: BlockPrices, x, objective) -> None:
    r = problem.forward_repeats
    for k, ((f, b), choices) in enumerate(problem.terms.any_of):
        y = model.column(f"y{k}")
        for v, s in choices:  # (c)
            model.row([(y, 1), (x[v, s], -1)], low=0)
        objective.append((y, r * f + b))


def _add_gated(model: LinearModel, problem: BlockPrices, x, objective) -> None:
    """A gated any-of term costs when its gate holds and any of its choices does:
    g[k] >= x[w,s_w] + x[v,s] - 1 for each (v,s) of k.                                    (c')"""
    r = problem.forward_repeats
    for k, ((f, b), (w, s_w), choices) in enumerate(problem.terms.gated):
        g = model.column(f"g{k}")
        for v, s in choices:
            model.row([(g, 1), (x[w, s_w], -1), (x[v, s], -1)], low=-1)
        objective.append((g, r * f + b))


def _add_pure(model: LinearModel, problem: BlockPrices, x, objective, memory, constants) -> None:
    """A pure node costs its R price less the saving of the one sharded layout it runs on:
    z[n,S] <= the origins that can be colwise, summed; z[n,Q] <= those that can be rowwise
    (reduce-scattered under SP); z[n,S] + z[n,Q] <= 1.                                   (d)
    Its R price and bytes go to ``constants`` (the objective's and the memory row's)."""
    need = {"S": "colwise", "Q": "rowwise"}
    for k, (n, pure) in enumerate(problem.pure.items()):
        constants[0].append(pure.time_s["R"])
        constants[1].append(pure.bytes["R"])
        zs = []
        for layout, origins in pure.sharding.items():
            z = model.column(f"z{k}_{layout}")
            model.row([(z, 1), *((x[u, need[layout]], -1) for u in origins)], up=0)
            objective.append((z, -(pure.time_s["R"] - pure.time_s[layout])))
            memory.append((z, -(pure.bytes["R"] - pure.bytes[layout])))
            zs.append(z)
        if len(zs) > 1:
            model.row([(z, 1) for z in zs], up=1)


def _add_tie_rows(model: LinearModel, problem: BlockPrices, x) -> None:
    for u, w in problem.ties:  # (e)
        for s in problem.legal[u]:
            model.row([(x[u, s], 1), *([(x[w, s], -1)] if (w, s) in x else [])], low=0, up=0)
    for u, w, ku, kw in problem.dim_ties:
        for dim in (None, 0, 1):
            left = [(x[u, s], 1) for s in problem.legal[u] if shard_dim(ku, s) == dim]
            right = [(x[w, s], -1) for s in problem.legal[w] if shard_dim(kw, s) == dim]
            model.row(left + right, low=0, up=0)


# ---- the reference -----------------------------------------------------------------------
def brute_force_block(
    problem: BlockPrices, *, memory_budget_bytes: float | None = None
) -> tuple[dict[str, str], float] | None:
    """Enumerate every assignment (small blocks only): the exact optimum the ILP must match."""
    best: tuple[dict[str, str], float] | None = None
    for combo in itertools.product(*(problem.legal[v] for v in problem.params)):
        splits = dict(zip(problem.params, combo))
        if not problem.respects_ties(splits):
            continue
        memory = problem.evaluate(splits)[1]
        if memory_budget_bytes is not None and memory > memory_budget_bytes + 1e-6:
            continue
        time_s = objective_s(problem, splits)
        if best is None or time_s < best[1]:
            best = (splits, time_s)
    return best
