"""The intra-operator ILP: one split per parameterised op of a block (Alpa, OSDI'22, section 4.2;
docs/ilp.md, section 2). Terms from autoplan.cost.tp.splits, priced as CostModel prices them
(cost/compute/op_costs.py), so the objective and memory row equal what CostModel charges the block.

    x[v,s] in {0,1}      v parameterised, s in legal_splits(v, tp);  sum_s x[v,s] = 1     (a)
    e[u,v,a,c] in [0,1]  per edge/sibling pair;  sum_c e = x[u,a],  sum_a e = x[v,c]      (b)
    y[k] in [0,1]        per any-of term k;       y[k] >= x[v,s] for each (v,s) of k       (c)
    z[n,L] in [0,1]      per pure node n and layout L in {S, Q} its origins allow;
                         z[n,S] <= x[u,colwise], z[n,Q] <= x[u,rowwise] for u in origins(n)  (d)
    ties                 x[u,s] = x[w,s] (one module); equal shard dims (shared parameter)  (e)
    memory               sum bytes(v,s) x + sum_n (act_R(n) - sum_L (act_R - act_L)(n) z[n,L]) + const <= budget  (f)
    minimise  sum x[v,s] (compute(v,s) + unary_comm(v,s)) + sum e pair_comm + sum y anyof_comm
              + sum_n (t_R(n) - sum_L (t_R(n) - t_L(n)) z[n,L]) + constants      (s per micro-batch)

(b) forces e = x[u,a] x[v,c] at 0/1 marginals (linearising the resharding term); (c) and (d) are
exact at the optimum. The forward counts ``forward_repeats`` times (2 under full recomputation).
A NaN, negative or too-small budget is infeasible before any solve (:func:`budget_infeasibility`).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field

import pulp

from autoplan.cost.compute.op_costs import NodeTimes, node_saved_bytes, node_time_s
from autoplan.cost.tp.block import BlockAnalysis, analyse_block
from autoplan.cost.tp.memory import param_copy_bytes, stream_copy_bytes
from autoplan.cost.tp.shards import (
    param_node_shards,
    pure_layout,
    pure_layouts_possible,
    pure_node_shards,
    stream_node_shards,
)
from autoplan.cost.tp.splits import TPContext, TPTerms, block_terms, legal_splits, terms_time_s
from autoplan.solve.backend import SolveStatus, solve_model, variable
from autoplan.types.graph import Graph

SHARD_DIM = {
    ("linear", "colwise"): 0,
    ("linear", "rowwise"): 1,
    ("embedding", "rowwise"): 0,
    ("embedding", "colwise"): 1,
}


@dataclass
class PureNode:
    """A pure node's time and saved bytes on each layout its origins can give it (R, S, Q)."""

    origins: frozenset[str]
    time_s: dict[str, float]
    bytes: dict[str, float]


@dataclass
class BlockProblem:
    """Everything the ILP (and the brute force that checks it) prices, for one block."""

    params: list[str]
    legal: dict[str, tuple[str, ...]]
    unary_s: dict[str, dict[str, float]]  # compute + unary comm, per split
    unary_bytes: dict[str, dict[str, float]]  # parameter + saved bytes, per split
    pure: dict[str, PureNode]  # pure node -> its price per layout
    terms: TPTerms
    forward_repeats: int
    constant_s: float = 0.0
    constant_bytes: float = 0.0
    ties: list[tuple[str, str]] = field(default_factory=list)
    sequence_parallel: bool = False
    block: BlockAnalysis | None = None  # the block's structure (layouts of pure nodes)
    dim_ties: list[tuple[str, str, str, str]] = field(default_factory=list)  # (u, w, kind_u, kind_w)

    def evaluate(self, splits: dict[str, str]) -> tuple[float, float]:
        """(seconds, bytes) of ``splits``: the ILP's objective and memory row, evaluated directly."""
        fwd, bwd = terms_time_s(_without_unary(self.terms), splits)
        time_s = self.constant_s + self.forward_repeats * fwd + bwd
        memory = self.constant_bytes
        for v in self.params:
            time_s += self.unary_s[v][splits[v]]
            memory += self.unary_bytes[v][splits[v]]
        for pure in self.pure.values():
            layout = pure_layout(self.block, pure.origins, splits, sequence_parallel=self.sequence_parallel)
            time_s += pure.time_s[layout]
            memory += pure.bytes[layout]
        return time_s, memory

    def min_memory_bytes(self) -> float:
        """A lower bound on the memory row: each op at its lightest split, independently."""
        memory = self.constant_bytes + sum(min(self.unary_bytes[v].values()) for v in self.params)
        return memory + sum(min(pure.bytes.values()) for pure in self.pure.values())

    def respects_ties(self, splits: dict[str, str]) -> bool:
        if any(splits[u] != splits[w] for u, w in self.ties):
            return False
        return all(SHARD_DIM.get((ku, splits[u])) == SHARD_DIM.get((kw, splits[w])) for u, w, ku, kw in self.dim_ties)


def _without_unary(terms: TPTerms) -> TPTerms:
    return TPTerms(constant=terms.constant, unary={}, pair=terms.pair, any_of=terms.any_of)


def build_block_problem(
    graph: Graph,
    layer: str | None,
    *,
    ctx: TPContext,
    forward_repeats: int = 1,
    param_bytes_factor: float = 0.0,
    activation_factor: float = 0.0,
    node_times: NodeTimes | None = None,
) -> BlockProblem:
    """Price block ``layer`` for the ILP. ``param_bytes_factor`` multiplies traced parameter
    bytes, and ``activation_factor`` the saved bytes of the traced batch in the run's precision
    (``compute.saved_activation_bytes``), into bytes per device (0 = ignore). Times and shard
    factors are those CostModel charges (cost/compute/op_costs.py, tp_shards.shards); ``node_times``
    memoises the op times."""
    block = analyse_block(graph, layer)
    terms = block_terms(graph, layer, ctx=ctx)
    tp, sp = ctx.tp, ctx.sequence_parallel and ctx.tp > 1
    problem = BlockProblem(
        params=list(block.params),
        legal={v: legal_splits(graph.node(v), tp) for v in block.params},
        unary_s={},
        unary_bytes={},
        pure={},
        terms=terms,
        forward_repeats=forward_repeats,
        sequence_parallel=sp,
        block=block,
    )

    def time_of(node, shard: int) -> float:
        return node_time_s(
            graph,
            node,
            ctx.profile,
            precision=ctx.precision,
            batch_fraction=ctx.batch_fraction,
            shard=shard,
            forward_repeats=forward_repeats,
            times=node_times,
        )

    seen_params: set[str] = set()
    for node in block.nodes:
        own = [p for p in node.param_names if p not in seen_params]
        seen_params.update(own)
        pbytes = sum(graph.parameters[p].bytes for p in own if p in graph.parameters) * param_bytes_factor
        abytes = (
            node_saved_bytes(node, ctx.profile, precision=ctx.precision) * activation_factor
            if activation_factor
            else 0.0
        )
        if node.name in problem.legal:
            copies = {
                split: param_copy_bytes(graph, block, node.name, split, tp=tp, precision=ctx.precision)
                * activation_factor
                for split in problem.legal[node.name]
            }
            _price_param(problem, node, time_of, pbytes, abytes, copies, tp=tp)
        elif node.name in block.origins:
            origins = block.origins[node.name]
            shard = {
                lay: pure_node_shards(lay, tp=tp)
                for lay in pure_layouts_possible(block, origins, problem.legal, sequence_parallel=sp)
            }
            problem.pure[node.name] = PureNode(
                origins=origins,
                time_s={lay: time_of(node, c) for lay, (c, _) in shard.items()},
                bytes={lay: abytes / a for lay, (_, a) in shard.items()},
            )
        else:
            compute, act = stream_node_shards(
                node, tp=tp, sequence_parallel=sp, token_wise=node.name in block.token_wise
            )
            problem.constant_s += time_of(node, compute)
            problem.constant_bytes += pbytes + abytes / act
    problem.constant_bytes += (
        sum(stream_copy_bytes(graph, block, tp=tp, sequence_parallel=sp, precision=ctx.precision).values())
        * activation_factor
    )
    _add_ties(graph, problem)
    return problem


def _price_param(
    problem: BlockProblem, node, time_of, pbytes: float, abytes: float, copies: dict[str, float], *, tp: int
) -> None:
    problem.unary_s[node.name], problem.unary_bytes[node.name] = {}, {}
    for s in problem.legal[node.name]:
        compute, param, act = param_node_shards(
            problem.block, node.name, s, tp=tp, sequence_parallel=problem.sequence_parallel
        )
        problem.unary_s[node.name][s] = time_of(node, compute) + _unary_comm(
            problem.terms, node.name, s, problem.forward_repeats
        )
        problem.unary_bytes[node.name][s] = pbytes / param + abytes / act + copies[s]


def _unary_comm(terms: TPTerms, v: str, split: str, forward_repeats: int) -> float:
    fwd, bwd = terms.unary.get(v, {}).get(split, (0.0, 0.0))
    return forward_repeats * fwd + bwd


def _add_ties(graph: Graph, problem: BlockProblem) -> None:
    by_module: dict[str, str] = {}
    by_param: dict[str, str] = {}
    for v in problem.params:
        node = graph.node(v)
        if node.module in by_module:
            problem.ties.append((by_module[node.module], v))
        by_module.setdefault(node.module, v)
        for p in node.param_names:
            if p in by_param and graph.node(by_param[p]).module != node.module:
                problem.dim_ties.append((by_param[p], v, graph.node(by_param[p]).op, node.op))
            by_param.setdefault(p, v)


# ---- the ILP -----------------------------------------------------------------------------
@dataclass
class BlockSolution:
    splits: dict[str, str]
    time_s: float
    memory_bytes: float
    status: SolveStatus


def solve_block(
    problem: BlockProblem,
    *,
    memory_budget_bytes: float | None = None,
    solver: str = "highs",
    time_limit_s: float = 10.0,
) -> BlockSolution | None:
    """The split of each parameterised op minimising the block's time within the budget;
    None when no assignment fits the budget (:func:`budget_infeasibility` says why)."""
    if memory_budget_bytes is not None and math.isinf(memory_budget_bytes) and memory_budget_bytes > 0:
        memory_budget_bytes = None  # an unlimited budget is no row at all
    if memory_budget_bytes is not None and budget_infeasibility(problem, memory_budget_bytes):
        return None
    model = pulp.LpProblem("intra_op", pulp.LpMinimize)
    x = {
        (v, s): variable(model, f"x{i}_{j}", low=0, up=1, cat="Binary")
        for i, v in enumerate(problem.params)
        for j, s in enumerate(problem.legal[v])
    }
    objective = [problem.constant_s]
    memory = [problem.constant_bytes]
    for v in problem.params:
        model += pulp.lpSum(x[v, s] for s in problem.legal[v]) == 1  # (a)
        objective += [problem.unary_s[v][s] * x[v, s] for s in problem.legal[v]]
        memory += [problem.unary_bytes[v][s] * x[v, s] for s in problem.legal[v]]
    _add_pairs(model, problem, x, objective)
    _add_any_of(model, problem, x, objective)
    _add_pure(model, problem, x, objective, memory)
    _add_tie_rows(model, problem, x)
    if memory_budget_bytes is not None:
        model += pulp.lpSum(memory) <= memory_budget_bytes  # (f)
    model += pulp.lpSum(objective)
    status = solve_model(model, solver=solver, time_limit_s=time_limit_s)
    if not status.has_solution:
        return None
    splits = {v: max(problem.legal[v], key=lambda s: x[v, s].value() or 0.0) for v in problem.params}
    time_s, memory_bytes = problem.evaluate(splits)
    return BlockSolution(splits=splits, time_s=time_s, memory_bytes=memory_bytes, status=status)


def budget_infeasibility(problem: BlockProblem, memory_budget_bytes: float) -> str:
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


def _add_pairs(model, problem: BlockProblem, x, objective) -> None:
    r = problem.forward_repeats
    for k, ((u, v), table) in enumerate(problem.terms.pair.items()):
        if not any(f or b for f, b in table.values()):
            continue
        e = {(a, c): variable(model, f"e{k}_{i}", low=0, up=1) for i, (a, c) in enumerate(table)}
        for a in problem.legal[u]:  # (b)
            model += pulp.lpSum(e[a, c] for c in problem.legal[v]) == x[u, a]
        for c in problem.legal[v]:
            model += pulp.lpSum(e[a, c] for a in problem.legal[u]) == x[v, c]
        objective += [(r * f + b) * e[key] for key, (f, b) in table.items() if f or b]


def _add_any_of(model, problem: BlockProblem, x, objective) -> None:
    r = problem.forward_repeats
    for k, ((f, b), choices) in enumerate(problem.terms.any_of):
        y = variable(model, f"y{k}", low=0, up=1)
        for v, s in choices:  # (c)
            model += y >= x[v, s]
        objective.append((r * f + b) * y)


def _add_pure(model, problem: BlockProblem, x, objective, memory) -> None:
    """A pure node costs its R price less the saving of each layout it runs on: z[n,S] <= every
    origin colwise, z[n,Q] <= every origin rowwise (reduce-scattered under SP).      (d)"""
    need = {"S": "colwise", "Q": "rowwise"}
    for k, (n, pure) in enumerate(problem.pure.items()):
        objective.append(pure.time_s["R"])
        memory.append(pure.bytes["R"])
        for layout in (lay for lay in pure.time_s if lay != "R"):
            z = variable(model, f"z{k}_{layout}", low=0, up=1)
            for u in pure.origins:
                model += z <= x[u, need[layout]]
            objective.append(-(pure.time_s["R"] - pure.time_s[layout]) * z)
            memory.append(-(pure.bytes["R"] - pure.bytes[layout]) * z)


def _add_tie_rows(model, problem: BlockProblem, x) -> None:
    for u, w in problem.ties:  # (e)
        for s in problem.legal[u]:
            model += x[u, s] == (x[w, s] if (w, s) in x else 0)
    for u, w, ku, kw in problem.dim_ties:
        for dim in (None, 0, 1):
            left = [x[u, s] for s in problem.legal[u] if SHARD_DIM.get((ku, s)) == dim]
            right = [x[w, s] for s in problem.legal[w] if SHARD_DIM.get((kw, s)) == dim]
            model += pulp.lpSum(left) == pulp.lpSum(right)


# ---- the reference -----------------------------------------------------------------------
def brute_force_block(
    problem: BlockProblem, *, memory_budget_bytes: float | None = None
) -> tuple[dict[str, str], float] | None:
    """Enumerate every assignment (small blocks only): the exact optimum the ILP must match."""
    best: tuple[dict[str, str], float] | None = None
    for combo in itertools.product(*(problem.legal[v] for v in problem.params)):
        splits = dict(zip(problem.params, combo))
        if not problem.respects_ties(splits):
            continue
        time_s, memory = problem.evaluate(splits)
        if memory_budget_bytes is not None and memory > memory_budget_bytes + 1e-6:
            continue
        if best is None or time_s < best[1]:
            best = (splits, time_s)
    return best
