"""A whole-model tp_plan from the per-block ILP, solved once per group of identical blocks.

For a (tp, sequence parallelism, precision, micro-batch) choice, :class:`TPPlanner` solves the
intra-op ILP (solve/intra_op.py) for the first block of every LayerGroup and for the nodes
outside every block, then copies each representative's splits to the other members of its
group position by position (members are structurally identical: same ops in the same order).
A 96-layer GPT therefore costs one block ILP, not 96. Results are cached per choice (and per
memory budget when the search asks for a memory-constrained solve). A choice names its dtype policy
(compute/dtypes.py), so splits are priced at the run dtypes the final price charges. Under a choice, a block's
prices (cost/tp/split_prices.py ``price_block``) read the graph, the block, the context (``TPContext.key``, the
policy in it; the profile is the planner's), the forward re-runs and the budget's three factors, and are kept on
these; its ILP's answer reads those prices and the block's byte limit only, and is kept on the block, the prices'
``fingerprint`` and the limit: budgets that differ only in another block's limit (the search's memory-constrained
retries) solve the blocks they share once, and so do policies (or contexts) that price a block alike. Given a
``step`` (cost/dp/param_step.py: the plan's ZeRO stage, dp groups and micro-batches), each split's objective also
carries what the step charges its parameters once a step (dp messages, optimizer step) over the micro-batches: a
step's seconds kept per block, tp, SP and ``step.step_key`` (rank_params per block, tp and SP). The ILP without it
answers first; where its optimum already gives each node a split of the least step seconds (Megatron's splits shard
every parameter), it is the optimum with the term too, and only the others solve the ILP with the term, once per
block, fingerprint, term seconds and limit (step keys that charge alike share it); either answer is kept on the
block, fingerprint, tp, step key and limit. Equal splits make one tp_plan.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from autoplan.cost import (
    BlockPrices,
    DtypePolicy,
    MemoryBudget,
    NodeTimes,
    ParamStepPrice,
    TPContext,
    analyse_block,
    block_step_s,
    price_block,
    rank_params,
    split_context,
)
from autoplan.solve.backend import SolveStatus
from autoplan.solve.intra_op import BlockSolution, budget_infeasibility, solve_block
from autoplan.solve.linear import memoises
from autoplan.types.frozen_tp_plan import FrozenTpPlan
from autoplan.types.graph import Graph
from autoplan.types.plan import Plan
from autoplan.types.profile import Profile


@dataclass
class TPChoice:
    """The splits chosen for one (tp, sp, precision, micro-batch) choice, and how the solves went."""

    tp_plan: dict[str, str]
    statuses: list[SolveStatus] = field(default_factory=list)
    feasible: bool = True
    reason: str = ""  # why no splits fit the memory budget (when not feasible)

    @property
    def status(self) -> str:
        if not self.feasible:
            return "infeasible"
        return "time_limit" if any(s.status == "time_limit" for s in self.statuses) else "optimal"

    @property
    def gap(self) -> float:
        return max((s.gap or 0.0 for s in self.statuses), default=0.0)


class TPPlanner:
    def __init__(
        self,
        graph: Graph,
        profile: Profile,
        *,
        solver: str = "highs",
        time_limit_s: float = 10.0,
        node_times: NodeTimes | None = None,
    ):
        self.graph, self.profile = graph, profile
        self.solver, self.time_limit_s = solver, time_limit_s
        self.node_times = node_times or NodeTimes(graph, profile)  # op times, memoised across choices
        self._cache: dict[tuple, TPChoice] = {}
        self._prices: dict[tuple, tuple] = {}  # (prices, fingerprint) per block, context, re-runs and factors
        self._answers: dict[tuple, BlockSolution | None] = {}  # per block, fingerprint and byte limit (docstring)
        self._steps: dict[tuple, dict] = {}  # block_step_s per block, tp, SP and step key
        self._ranks: dict[tuple, tuple] = {}  # rank_params per block, tp and SP (all it reads)
        self._stepped: dict[tuple, BlockSolution | None] = {}  # _with_step's answer per its key
        self._plans: dict[tuple, FrozenTpPlan] = {}  # per the representatives' splits, tp and SP (_tp_plan)
        self._models: dict = {}  # HiGHS's answers per model (solve/linear.py solve's memo)
        self.solves = 0  # the ILPs solved, each distinct model once

    def choose(
        self,
        *,
        dp: int,
        tp: int,
        pp: int,
        sequence_parallel: bool,
        precision: str,
        micro_batch_size: int,
        forward_repeats: int = 1,
        budget: MemoryBudget | None = None,
        cp: int = 1,
        cp_variant: str = "allgather",
        fused: bool = False,
        dtypes: DtypePolicy | None = None,
        step: ParamStepPrice | None = None,
    ) -> TPChoice:
        """The tp_plan for one choice (cached); ``budget`` adds the memory row; under cp the block is
        priced at a rank's 1/cp of the tokens, with its K,V exchange (split_context); ``dtypes`` the run's
        dtype policy (compute/dtypes.py dtype_policy; None: every activation in ``precision``); ``step`` adds the
        step term (module docstring; None: a micro-batch's seconds alone)."""
        ctx = split_context(
            self.graph,
            self.profile,
            dp=dp,
            tp=tp,
            pp=pp,
            sequence_parallel=sequence_parallel,
            precision=precision,
            micro_batch_size=micro_batch_size,
            cp=cp,
            cp_variant=cp_variant,
            fused=fused,
            dtypes=dtypes,
        )
        key = (*ctx.key, forward_repeats, budget, step and step.key)
        if key not in self._cache:
            self._cache[key] = self._solve(ctx, forward_repeats, budget, step) if tp > 1 else TPChoice(tp_plan={})
        return self._cache[key]

    def statuses(self) -> list:
        """Every block ILP's solver status so far (what the search reports as its ILP status)."""
        return [status for choice in self._cache.values() for status in choice.statuses]

    def _solve(
        self, ctx: TPContext, forward_repeats: int, budget: MemoryBudget | None, step: ParamStepPrice | None
    ) -> TPChoice:
        choice, answers = TPChoice(tp_plan={}), []
        for rep in [None, *(g.layers[0] for g in self.graph.groups)]:
            factors = (
                dict(
                    param_bytes_factor=budget.param_bytes_factor,
                    activation_factor=budget.activation_factor,
                    frozen_param_bytes_factor=budget.frozen_param_bytes_factor,
                )
                if budget
                else {}
            )
            key = (rep, *ctx.key, forward_repeats, *factors.values())
            if key not in self._prices:
                problem = price_block(
                    self.graph, rep, ctx=ctx, forward_repeats=forward_repeats, node_times=self.node_times, **factors
                )
                self._prices[key] = problem, problem.fingerprint()
            problem, fingerprint = self._prices[key]
            limit = None if budget is None else (budget.outside_bytes if rep is None else budget.block_bytes)
            why = (
                budget_infeasibility(problem, limit)
                if limit is not None and not (math.isinf(limit) and limit > 0)
                else ""
            )
            solution = None if why else self._answer(problem, (rep, fingerprint, limit), limit)
            if solution is not None and step is not None:
                solution = self._with_step(problem, (rep, fingerprint, ctx.tp, step.key, limit), solution, ctx, step)
            if solution is None:
                part = "the modules outside the blocks" if rep is None else f"block {rep}"
                why = why or f"no splits of {part} fit its {limit / 2**30:.3g} GiB budget"
                return TPChoice(
                    tp_plan={},
                    statuses=choice.statuses,
                    feasible=False,
                    reason=f"tp ILP infeasible at tp={ctx.tp}: {why}",
                )
            choice.statuses.append(solution.status)
            answers.append((rep, tuple(solution.splits.items())))
        choice.tp_plan = self._tp_plan(tuple(answers), ctx)
        return choice

    def _tp_plan(self, answers: tuple, ctx: TPContext) -> FrozenTpPlan:
        """The whole-model tp_plan of ``answers`` (each representative's splits), made and validated once per those,
        tp and SP (all :meth:`_copy` reads): choices apart only in their step term or budget share one."""
        key = (ctx.tp, ctx.sequence_parallel, answers)
        if key not in self._plans:
            tp_plan: dict[str, str] = {}
            members = {g.layers[0]: g.layers for g in self.graph.groups}
            for rep, splits in answers:
                self._copy(dict(splits), rep, members.get(rep, [None]), tp_plan, ctx)
            Plan(
                devices=ctx.tp, dp=1, tp=ctx.tp, pp=1, micro_batch_size=1, num_microbatches=1, tp_plan=tp_plan
            )  # validates the splits once
            self._plans[key] = FrozenTpPlan(tp_plan)  # shared by every candidate: memos key on its identity
        return self._plans[key]

    def _step_s(self, rep: str | None, ctx: TPContext, step: ParamStepPrice, *, per_step: bool = False) -> dict:
        """block_step_s of ``rep`` (read only) over the step's micro-batches (``per_step``: a step's seconds, which
        order each node's splits alike), kept on what it reads: the block, tp, SP and the step's (step) key."""
        key = (rep, ctx.tp, ctx.sequence_parallel, step.step_key if per_step else step.key)
        if key not in self._steps:
            if per_step:
                self._steps[key] = block_step_s(self.graph, rep, ctx, step, ranks=self._rank_params(rep, ctx))
            else:
                m, table = step.num_microbatches, self._step_s(rep, ctx, step, per_step=True)
                self._steps[key] = {v: {s: t / m for s, t in splits.items()} for v, splits in table.items()}
        return self._steps[key]

    def _rank_params(self, rep: str | None, ctx: TPContext) -> tuple:
        """rank_params of ``rep`` (cost/dp/param_step.py), kept on all it reads: the block, tp and SP."""
        key = (rep, ctx.tp, ctx.sequence_parallel)
        if key not in self._ranks:
            self._ranks[key] = rank_params(self.graph, rep, tp=ctx.tp, sequence_parallel=ctx.sequence_parallel)
        return self._ranks[key]

    def _with_step(
        self, problem: BlockPrices, key: tuple, solution: BlockSolution, ctx: TPContext, step
    ) -> BlockSolution | None:
        """The answer with ``step``'s term for the block ``key`` names (block, fingerprint, tp, the step's key and the
        limit), kept on ``key``: ``solution`` (the optimum without it, which the block, fingerprint and limit fix)
        where each node's split already pays the least step seconds of its splits, as no assignment pays less for
        the block nor for its step (its objective then with the term); else the ILP with the term, solved once per
        block, fingerprint, term (each node's seconds per split, in order) and limit: all its model reads."""
        if key not in self._stepped:
            rep, per_step = key[0], self._step_s(key[0], ctx, step, per_step=True)
            if solution.status.status == "optimal" and all(
                table[solution.splits[v]] == min(table.values()) for v, table in per_step.items()
            ):
                least_s = sum(table[solution.splits[v]] for v, table in per_step.items()) / step.num_microbatches
                objective = solution.status.objective + least_s
                self._stepped[key] = replace(solution, status=replace(solution.status, objective=objective))
            else:  # the model reads the prices, the term and the limit: step keys that charge alike solve once
                step_s = self._step_s(rep, ctx, step)
                seconds = tuple((v, tuple(table.items())) for v, table in step_s.items())
                solved = (*key[:2], seconds, key[-1])  # the block, fingerprint, term and limit
                self._stepped[key] = self._answer(replace(problem, step_s=step_s), solved, key[-1])
        return self._stepped[key]

    def _answer(self, problem: BlockPrices, key: tuple, limit: float | None) -> BlockSolution | None:
        """solve_block of ``problem`` within ``limit``, solved once per ``key`` (block, fingerprint, limit)."""
        if key not in self._answers:
            runs = len(self._models)
            how = dict(solver=self.solver, time_limit_s=self.time_limit_s, memo=self._models)
            self._answers[key] = solve_block(problem, memory_budget_bytes=limit, **how)
            self.solves += len(self._models) > runs or not memoises(self.solver)  # PuLP's runs: no memo
        return self._answers[key]

    def _copy(
        self, splits: dict[str, str], rep: str | None, members: list, tp_plan: dict[str, str], ctx: TPContext
    ) -> None:
        rep_params = analyse_block(self.graph, rep).params
        for member in members:
            params = analyse_block(self.graph, member).params
            for rep_node, node in zip(rep_params, params):
                # explicit, even "replicate": an empty tp_plan at tp > 1 means the Megatron default (default_tp_plan)
                # to CostModel and the executor alike
                tp_plan.setdefault(self.graph.node(node).module, splits[rep_node])
            if ctx.sequence_parallel:
                block = analyse_block(self.graph, member)
                for node in block.nodes:
                    if (
                        node.op == "norm"
                        and node.name not in block.token_wise  # an MoE block takes no split (tp_block)
                        and node.module
                        and node.output_shape[1:2]
                        and node.output_shape[1] % ctx.tp == 0
                    ):
                        tp_plan.setdefault(node.module, "sequence_parallel")
