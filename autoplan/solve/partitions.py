"""A plan's pipeline stages for the search: the min-max partition of solve/pipeline.py over the cost
model's own block times (solve/stage_costs.py), memoised per the plan fields that set them, and the
partition under the memory limits when the time-optimal one does not fit. Each partition is solved once
per distinct problem (PartitionProblem.content_key): plans that differ in fields the blocks' times do not
read (ZeRO stage, schedule of the same placement, FP8 recipe where no fp8 linear runs) share it."""

from __future__ import annotations

from autoplan.cost import TpPlanMemo, balanced_stages
from autoplan.solve.pipeline import Partition, PartitionProblem, partition
from autoplan.solve.stage_costs import StageCosts
from autoplan.types.graph import Graph
from autoplan.types.plan import Plan
from autoplan.types.schedule_steps import schedule_step_plan
from autoplan.types.schedules import v_shaped

#: answers kept per problem shape as hints, each one evaluation (O(pp)) per problem: on the 739 V problems of
#: DeepSeek-V3's plan on 2,048 H100s, the last 4 put the ceiling within 0.1 % of the optimum for 678 of the 730
#: that fit (343 at it)
RECENT_HINTS = 4


class Partitions:
    def __init__(self, graph: Graph, stage_costs: StageCosts, *, solver: str):
        self.graph, self.stage_costs, self.solver = graph, stage_costs, solver
        self._memo = TpPlanMemo()
        self._solved: dict[tuple, Partition | None] = {}
        self._recent: dict[tuple, list[list[int]]] = {}  # per shape, the last answers: partition()'s hints

    def stages(self, plan: Plan) -> list[list[str]]:
        """Stages (``pp * v`` chunks when interleaved): the min-max partition of solve/pipeline.py,
        which minimises the slowest stage's total over its chunks, as CostModel charges it (its re-runs and memory
        those of one schedule step: types/schedule_steps.py)."""
        plan, layers = schedule_step_plan(plan), self.graph.layers
        if plan.pp == 1:
            return [list(layers)]
        chunks = plan.pp * plan.virtual_stages

        def make() -> list[list[str]]:  # without a memory limit, GPipe and 1F1B share one problem
            found = self._partition(self.stage_costs.problem(plan, memory_limit=False))
            return stages_from(layers, found.bounds) if found else balanced_stages(layers, chunks)

        return self._memo.get(self._time_key(plan), plan.tp_plan, make)

    def within_memory(self, plan: Plan) -> list[list[str]] | None:
        """The best stages under the memory limits (one schedule step's), or None when no partition fits."""
        found = self._partition(self.stage_costs.problem(schedule_step_plan(plan), memory_limit=True))
        return None if found is None else stages_from(self.graph.layers, found.bounds)

    def _time_key(self, plan: Plan) -> tuple:
        """The plan fields the problem without a memory limit reads (StageCosts.problem): the blocks' summaries
        (their context's key), their recompute, its re-runs (StageCosts.partition_reruns) and overlap, the pp
        group's cuts, and the chunks' placement."""
        ctx = self.stage_costs.context(plan)
        placement = (plan.pp, plan.virtual_stages, v_shaped(plan.schedule))
        reruns = self.stage_costs.partition_reruns(plan)
        return (*ctx.key, plan.recompute, reruns, plan.tp_comm_overlap, plan.dp, plan.tp, plan.cp, *placement)

    def _partition(self, problem: PartitionProblem) -> Partition | None:
        """partition(), once per distinct problem, with the last answers to problems of its shape as hints:
        the V placement's DP prunes to their best value here (solve/partition_v.py), and a like problem's
        answer is often this one's."""
        key = problem.content_key()
        if key not in self._solved:
            shape = (problem.layers, problem.pp, problem.virtual_stages, problem.v_shape)
            recent = self._recent.setdefault(shape, [])
            found = self._solved[key] = partition(problem, solver=self.solver, hints=recent)
            if found is not None and found.bounds not in recent:
                recent[:] = [found.bounds, *recent[: RECENT_HINTS - 1]]
        return self._solved[key]


def stages_from(layers: list[str], bounds: list[int]) -> list[list[str]]:
    return [list(layers[bounds[k] : bounds[k + 1]]) for k in range(len(bounds) - 1)]
