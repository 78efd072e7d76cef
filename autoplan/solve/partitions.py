"""A plan's pipeline stages for the search: the min-max partition of solve/pipeline.py over the cost
model's own block times (solve/stage_costs.py), memoised per the plan fields that set them, and the
partition under the memory limits when the time-optimal one does not fit."""

from __future__ import annotations

from autoplan.cost import TpPlanMemo, balanced_stages
from autoplan.solve.pipeline import partition
from autoplan.solve.stage_costs import StageCosts
from autoplan.types.graph import Graph
from autoplan.types.plan import Plan


class Partitions:
    def __init__(self, graph: Graph, stage_costs: StageCosts, *, solver: str):
        self.graph, self.stage_costs, self.solver = graph, stage_costs, solver
        self._memo = TpPlanMemo()

    def stages(self, plan: Plan) -> list[list[str]]:
        """Stages (``pp * v`` chunks when interleaved): the min-max partition of solve/pipeline.py,
        which minimises the slowest stage's total over its chunks, as CostModel charges it."""
        layers = self.graph.layers
        if plan.pp == 1:
            return [list(layers)]
        chunks = plan.pp * plan.virtual_stages
        key = (
            plan.tp,
            plan.dp,
            plan.sequence_parallel,
            plan.precision,
            plan.micro_batch_size,
            plan.recompute,
            plan.virtual_stages,
            plan.tp_comm_overlap,
            plan.ep,
            plan.cp,
            plan.cp_variant,
        )

        def make() -> list[list[str]]:  # without a memory limit, GPipe and 1F1B share one problem
            found = partition(self.stage_costs.problem(plan, memory_limit=False), solver=self.solver)
            return stages_from(layers, found.bounds) if found else balanced_stages(layers, chunks)

        return self._memo.get(key, plan.tp_plan, make)

    def within_memory(self, plan: Plan) -> list[list[str]] | None:
        """The best stages under the memory limits, or None when no partition fits."""
        found = partition(self.stage_costs.problem(plan, memory_limit=True), solver=self.solver)
        return None if found is None else stages_from(self.graph.layers, found.bounds)


def stages_from(layers: list[str], bounds: list[int]) -> list[list[str]]:
    return [list(layers[bounds[k] : bounds[k + 1]]) for k in range(len(bounds) - 1)]
