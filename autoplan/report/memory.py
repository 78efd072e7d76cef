"""What memory.png draws: per plan, the cost model's priced peak per device, split into the parts
that are alive at that moment, so each bar's stack sums to the peak that report.md and plan.json
state (cost/memory/per_device.py ``StageMemory.at_peak_bytes``), for the plans breakdown.png draws.

Each part's largest value over the step (``Cost.MEMORY_FIELDS``) would overstate the peak: the
activations peak before the backward, the gradients and sync buffers after it. A plan folder
without graph.json cannot be re-priced; its bar is plan.json's peak, split into the weights and
optimizer states (alive throughout) and the rest.
"""

from __future__ import annotations

from dataclasses import dataclass

from autoplan.cost import CostModel
from autoplan.display import MEMORY_NAMES
from autoplan.report.tables import describe_row, plans_table, top_feasible
from autoplan.types.cost import Cost
from autoplan.types.plan import Plan

REST = "gradients, activations and buffers"


@dataclass(frozen=True)
class MemoryBar:
    label: str
    parts_bytes: dict[str, float]  # display name -> bytes at the peak moment; they sum to peak_bytes
    peak_bytes: float

    def relabelled(self, label: str) -> MemoryBar:
        return MemoryBar(label, self.parts_bytes, self.peak_bytes)


def peak_parts(model: CostModel, plan: Plan) -> MemoryBar:
    """The most loaded stage's peak moment, as CostModel prices it."""
    return max(stage_bars(model, plan), key=lambda bar: bar.peak_bytes).relabelled(plan.describe())


def stage_bars(model: CostModel, plan: Plan) -> list[MemoryBar]:
    """Every pipeline stage of ``plan`` at its own peak moment (report.html's memory per stage)."""
    stages, _tp_plan, _ctx = model.priced_stages(plan)
    return [
        MemoryBar(
            f"stage {k}",
            {MEMORY_NAMES[name]: value for name, value in zip(Cost.MEMORY_FIELDS, memory.at_peak_bytes)},
            memory.peak_bytes,
        )
        for k, memory in enumerate(model.stage_memory(plan, stages))
    ]


def memory_bars(folder, result, *, top_k: int) -> list[MemoryBar]:
    """The bars of memory.png: breakdown.png's plans (plans.csv's top ranks) re-priced from the
    search ``result``, else plan.json's own peak."""
    if result is not None and folder.graph is not None and folder.profile is not None:
        model = CostModel(folder.graph, folder.profile)
        ranked = result.ranked()
        rows = top_feasible(plans_table(folder), top_k)
        return [
            peak_parts(model, ranked[int(row["rank"]) - 1].plan).relabelled(describe_row(row))
            for _, row in rows.iterrows()
            if int(row["rank"]) <= len(ranked)
        ]
    plan = folder.plan
    if plan is None or not plan.predicted or not plan.predicted.memory:
        return []
    memory, peak = plan.predicted.memory, plan.predicted.peak_memory_bytes
    held = {MEMORY_NAMES[n]: memory.get(n, 0.0) for n in ("weights_bytes", "optimizer_bytes")}
    return [MemoryBar(plan.describe(), {**held, REST: peak - sum(held.values())}, peak)]
