"""Weights tied across pipeline stages, and the gradient all-reduce that keeps them equal.

When a weight is used in more than one pipeline stage (an input embedding reused by the output
head), each stage holding it all-reduces its gradient with the others after the backward
(Megatron-LM's embedding-group all-reduce, Shoeybi et al. 2019; autoplan/execute/tied.py), of
the weight as each stage holds it (1/tp of it when tensor parallelism shards it, 1/dp of that
under ZeRO-2/3, where the sync runs on FSDP2's gradient shards), in fp32, on the pp link.
:class:`TiedWeightSync` holds that term for :class:`autoplan.cost.model.CostModel`.
"""

from __future__ import annotations

from autoplan.cost.network.comm import collective_time_s
from autoplan.cost.network.mesh import AxisGroup
from autoplan.cost.stages import StageTotals
from autoplan.types.layout import stage_of_block
from autoplan.types.plan import Plan


class TiedWeightSync:
    """Mixin of CostModel: reads ``graph``, ``profile``, ``_outside``, ``_tied`` and ``_chunks``."""

    def _tied_places(self) -> dict[str, set[str]]:
        """Parameters used in more than one place: name -> blocks (or "pre"/"post", the nodes
        before the first and after the last block) whose nodes use it."""
        places: dict[str, set[str]] = {}
        outside = {node.name: part for part, structure in self._outside.items() for node in structure.nodes}
        for node in self.graph.nodes:
            where = node.layer if node.layer is not None else outside.get(node.name)
            for name in node.param_names if where is not None else ():
                places.setdefault(name, set()).add(where)
        return {name: where for name, where in places.items() if len(where) > 1}

    def tied_elements_by_stage(self, plan: Plan, stages: list[StageTotals]) -> dict[int, float]:
        """Elements of weights tied across pipeline stages that each stage holding them all-reduces
        (as each stage holds them: 1/tp when TP shards them, and 1/dp of that under ZeRO-2/3, whose
        FSDP2 gradients are dp shards by then); empty without a pipeline."""
        if plan.pp == 1 or not self._tied:
            return {}
        stage_of = {"pre": 0, "post": plan.pp - 1}
        stage_of.update(stage_of_block(self._chunks(plan), pp=plan.pp))
        outside = (stages[0].blocks[0], stages[-1].blocks[-1])  # the pre and post summaries, which name real weights
        held = {name: n for block in outside for name, n in zip(block.param_names, block.param_numels)}
        params = self.graph.parameters
        sharded = plan.dp if plan.zero_stage >= 2 else 1  # autoplan/execute/tied.py reduces the local shard
        found: dict[int, float] = {}
        for name, where in self._tied.items():
            holders = {stage_of[w] for w in where}
            if len(holders) > 1:
                elements = held.get(name, params[name].numel if name in params else 0.0) / sharded
                for stage in holders:
                    found[stage] = found.get(stage, 0.0) + elements
        return found

    def _tied_sync_s(self, plan: Plan, stages: list[StageTotals], group: AxisGroup) -> float:
        """All-reduce of the gradients of weights tied across pipeline stages (module docstring):
        fp32 gradients, as the executor keeps them outside FSDP2's parameter cast."""
        tied = max(self.tied_elements_by_stage(plan, stages).values(), default=0.0)
        return collective_time_s(self.profile, "all_reduce", tied * 4, group=group) if tied else 0.0
