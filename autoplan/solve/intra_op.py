"""The intra-operator ILP: one split per parameterised op of a block (Alpa, OSDI'22, section 4.2).

Variables, for a block ``b`` at a tp degree (terms from autoplan.cost.tensor_parallel):

    x[v,s] in {0,1}      v parameterised, s in legal_splits(v, tp);  sum_s x[v,s] = 1     (a)
    e[u,v,a,c] in [0,1]  per edge/sibling pair;  sum_c e = x[u,a],  sum_a e = x[v,c]      (b)
    y[k] in [0,1]        per any-of term k;       y[k] >= x[v,s] for each (v,s) of k       (c)
    z[n] in [0,1]        per pure node n;         z[n] <= x[u,colwise] for u in origins(n) (d)

With x one-hot, (b) forces e[u,v,a,c] = x[u,a] * x[v,c] (the transportation polytope of two
0/1 marginals is a point): this linearises the quadratic resharding term. (c) and (d) are
exact at the optimum because y carries a non-negative cost and z a non-negative saving.

Objective (seconds per micro-batch, the forward counted ``forward_repeats`` times, 2 under
full recomputation):

    sum x[v,s] * (compute(v,s) + unary_comm(v,s)) + sum e * pair_comm + sum y * anyof_comm
    + sum_n (t_full(n) - (t_full(n) - t_shard(n)) * z[n]) + constants

Constraints: (a)-(d), ties (e) x[u,s] = x[w,s] for nodes of one module and equal shard dims
for nodes sharing a parameter (a tied embedding and head), and the memory row (f)
``sum bytes(v,s) x + sum act(n) (1 - (1 - 1/tp) z[n]) <= budget``. Identical blocks share one
problem: the planner solves it once per LayerGroup and reuses the splits (solve/tp_plan.py).
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import pulp

from autoplan.cost.compute import op_time_s
from autoplan.cost.tensor_parallel import STREAM_KINDS, TPContext, TPTerms, analyse_block, block_terms, legal_splits, terms_time_s
from autoplan.solve.backend import SolveStatus, solve_model, variable
from autoplan.types.graph import Graph

SHARD_DIM = {("linear", "colwise"): 0, ("linear", "rowwise"): 1, ("embedding", "rowwise"): 0, ("embedding", "colwise"): 1}


@dataclass
class BlockProblem:
    """Everything the ILP (and the brute force that checks it) prices, for one block."""

    params: list[str]
    legal: dict[str, tuple[str, ...]]
    unary_s: dict[str, dict[str, float]]                  # compute + unary comm, per split
    unary_bytes: dict[str, dict[str, float]]              # parameter + saved bytes, per split
    pure: dict[str, tuple[float, float, float, float, frozenset]]  # n -> (t_full, t_shard, act_full, act_shard, origins)
    terms: TPTerms
    forward_repeats: int
    constant_s: float = 0.0
    constant_bytes: float = 0.0
    ties: list[tuple[str, str]] = field(default_factory=list)
    gathered: frozenset[str] = frozenset()                 # fused linears (never shard what follows)
    dim_ties: list[tuple[str, str, str, str]] = field(default_factory=list)   # (u, w, kind_u, kind_w)

    def evaluate(self, splits: dict[str, str]) -> tuple[float, float]:
        """(seconds, bytes) of ``splits``: the ILP's objective and memory row, evaluated directly."""
        fwd, bwd = terms_time_s(_without_unary(self.terms), splits)
        time_s = self.constant_s + self.forward_repeats * fwd + bwd
        memory = self.constant_bytes
        for v in self.params:
            time_s += self.unary_s[v][splits[v]]
            memory += self.unary_bytes[v][splits[v]]
        for t_full, t_shard, a_full, a_shard, origins in self.pure.values():
            sharded = all(splits[u] == "colwise" and u not in self.gathered for u in origins)
            time_s += t_shard if sharded else t_full
            memory += a_shard if sharded else a_full
        return time_s, memory

    def min_memory_bytes(self) -> float:
        """A lower bound on the memory row: each op at its lightest split, independently."""
        memory = self.constant_bytes + sum(min(self.unary_bytes[v].values()) for v in self.params)
        for _, _, a_full, a_shard, origins in self.pure.values():
            can_shard = all("colwise" in self.legal[u] and u not in self.gathered for u in origins)
            memory += a_shard if can_shard else a_full
        return memory

    def respects_ties(self, splits: dict[str, str]) -> bool:
        if any(splits[u] != splits[w] for u, w in self.ties):
            return False
        return all(SHARD_DIM.get((ku, splits[u])) == SHARD_DIM.get((kw, splits[w])) for u, w, ku, kw in self.dim_ties)


def _without_unary(terms: TPTerms) -> TPTerms:
    return TPTerms(constant=terms.constant, unary={}, pair=terms.pair, any_of=terms.any_of)


def build_block_problem(graph: Graph, layer: str | None, *, ctx: TPContext, forward_repeats: int = 1,
                        param_bytes_factor: float = 0.0, activation_factor: float = 0.0) -> BlockProblem:
    """Price block ``layer`` for the ILP. ``param_bytes_factor`` multiplies traced parameter
    bytes and ``activation_factor`` traced saved bytes into bytes per device (0 = ignore)."""
    block = analyse_block(graph, layer)
    terms = block_terms(graph, layer, ctx=ctx)
    tp, sp = ctx.tp, ctx.sequence_parallel and ctx.tp > 1
    time_of = _timer(ctx, forward_repeats)
    problem = BlockProblem(params=list(block.params), legal={v: legal_splits(graph.node(v), tp) for v in block.params},
                           unary_s={}, unary_bytes={}, pure={}, terms=terms, forward_repeats=forward_repeats,
                           gathered=block.gathered)
    seen_params: set[str] = set()
    for node in block.nodes:
        own = [p for p in node.param_names if p not in seen_params]
        seen_params.update(own)
        pbytes = sum(graph.parameters[p].bytes for p in own if p in graph.parameters) * param_bytes_factor
        abytes = node.saved_bytes * activation_factor
        if node.name in problem.legal:
            problem.unary_s[node.name] = {s: time_of(node, tp if s != "replicate" else 1) + _unary_comm(terms, node.name, s, forward_repeats)
                                          for s in problem.legal[node.name]}
            problem.unary_bytes[node.name] = {s: pbytes / (tp if s != "replicate" else 1) + abytes / (tp if s == "rowwise" else 1)
                                              for s in problem.legal[node.name]}
        elif node.name in block.origins:
            problem.pure[node.name] = (time_of(node, 1), time_of(node, tp), abytes, abytes / tp, block.origins[node.name])
        else:
            way = tp if sp and node.op in STREAM_KINDS else 1
            problem.constant_s += time_of(node, way)
            problem.constant_bytes += pbytes + abytes / way
    _add_ties(graph, problem)
    return problem


def _timer(ctx: TPContext, forward_repeats: int):
    def time_of(node, shard: int) -> float:
        kwargs = dict(precision=ctx.precision, batch_fraction=ctx.batch_fraction, shard=shard)
        return forward_repeats * op_time_s(node, ctx.profile, **kwargs) + op_time_s(node, ctx.profile, backward=True, **kwargs)
    return time_of


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


def solve_block(problem: BlockProblem, *, memory_budget_bytes: float | None = None, solver: str = "highs",
                time_limit_s: float = 10.0) -> BlockSolution | None:
    """The split of each parameterised op minimising the block's time within the budget;
    None when no assignment fits the budget."""
    if memory_budget_bytes is not None and problem.min_memory_bytes() > memory_budget_bytes:
        return None                      # even the lightest split of every op is too heavy
    model = pulp.LpProblem("intra_op", pulp.LpMinimize)
    x = {(v, s): variable(model, f"x{i}_{j}", low=0, up=1, cat="Binary") for i, v in enumerate(problem.params) for j, s in enumerate(problem.legal[v])}
    objective = [problem.constant_s]
    memory = [problem.constant_bytes]
    for v in problem.params:
        model += pulp.lpSum(x[v, s] for s in problem.legal[v]) == 1                                  # (a)
        objective += [problem.unary_s[v][s] * x[v, s] for s in problem.legal[v]]
        memory += [problem.unary_bytes[v][s] * x[v, s] for s in problem.legal[v]]
    _add_pairs(model, problem, x, objective)
    _add_any_of(model, problem, x, objective)
    _add_pure(model, problem, x, objective, memory)
    _add_tie_rows(model, problem, x)
    if memory_budget_bytes is not None:
        model += pulp.lpSum(memory) <= memory_budget_bytes                                            # (f)
    model += pulp.lpSum(objective)
    status = solve_model(model, solver=solver, time_limit_s=time_limit_s)
    if not status.has_solution:
        return None
    splits = {v: max(problem.legal[v], key=lambda s: x[v, s].value() or 0.0) for v in problem.params}
    time_s, memory_bytes = problem.evaluate(splits)
    return BlockSolution(splits=splits, time_s=time_s, memory_bytes=memory_bytes, status=status)


def _add_pairs(model, problem: BlockProblem, x, objective) -> None:
    r = problem.forward_repeats
    for k, ((u, v), table) in enumerate(problem.terms.pair.items()):
        if not any(f or b for f, b in table.values()):
            continue
        e = {(a, c): variable(model, f"e{k}_{i}", low=0, up=1) for i, (a, c) in enumerate(table)}
        for a in problem.legal[u]:                                                                   # (b)
            model += pulp.lpSum(e[a, c] for c in problem.legal[v]) == x[u, a]
        for c in problem.legal[v]:
            model += pulp.lpSum(e[a, c] for a in problem.legal[u]) == x[v, c]
        objective += [(r * f + b) * e[key] for key, (f, b) in table.items() if f or b]


def _add_any_of(model, problem: BlockProblem, x, objective) -> None:
    r = problem.forward_repeats
    for k, ((f, b), choices) in enumerate(problem.terms.any_of):
        y = variable(model, f"y{k}", low=0, up=1)
        for v, s in choices:                                                                         # (c)
            model += y >= x[v, s]
        objective.append((r * f + b) * y)


def _add_pure(model, problem: BlockProblem, x, objective, memory) -> None:
    for k, (n, (t_full, t_shard, a_full, a_shard, origins)) in enumerate(problem.pure.items()):
        objective.append(t_full)
        memory.append(a_full)
        if not all((u, "colwise") in x and u not in problem.gathered for u in origins):
            continue
        z = variable(model, f"z{k}", low=0, up=1)
        for u in origins:                                                                            # (d)
            model += z <= x[u, "colwise"]
        objective.append(-(t_full - t_shard) * z)
        memory.append(-(a_full - a_shard) * z)


def _add_tie_rows(model, problem: BlockProblem, x) -> None:
    for u, w in problem.ties:                                                                        # (e)
        for s in problem.legal[u]:
            model += x[u, s] == (x[w, s] if (w, s) in x else 0)
    for u, w, ku, kw in problem.dim_ties:
        for dim in (None, 0, 1):
            left = [x[u, s] for s in problem.legal[u] if SHARD_DIM.get((ku, s)) == dim]
            right = [x[w, s] for s in problem.legal[w] if SHARD_DIM.get((kw, s)) == dim]
            model += pulp.lpSum(left) == pulp.lpSum(right)


# ---- the reference -----------------------------------------------------------------------
def brute_force_block(problem: BlockProblem, *, memory_budget_bytes: float | None = None) -> tuple[dict[str, str], float] | None:
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
