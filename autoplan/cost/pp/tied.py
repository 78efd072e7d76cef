"""Weights tied across pipeline stages, and the gradient all-reduce that keeps them equal.

A weight used in more than one pipeline stage (an input embedding reused by the output head) has
its gradient all-reduced by the stages holding it after the backward (Megatron-LM's embedding-group
all-reduce, Shoeybi et al. 2019; autoplan/execute/tied.py):

    t_tied = all_reduce(4 * max_stage sum_w held_w / s, group = pp)

over the weights w tied across stages, where held_w is w's elements as the stage holds it (1/tp of
them when tensor parallelism shards it), s = dp under ZeRO-2/3 (the sync runs on FSDP2's gradient
shards) and 1 otherwise, and 4 bytes because the executor keeps these gradients in fp32.
"""

from __future__ import annotations

from autoplan.cost.network.comm import collective_time_s
from autoplan.cost.network.mesh import AxisGroup
from autoplan.cost.stages import StageTotals
from autoplan.types.graph import Graph, OpNode
from autoplan.types.layout import stage_of_block
from autoplan.types.plan import Plan
from autoplan.types.profile import Profile
from autoplan.types.schedules import plan_last_stage, v_shaped


def tied_places(graph: Graph, outside: dict[str, tuple[OpNode, ...]]) -> dict[str, set[str]]:
    """Parameters used in more than one place: name -> the blocks (or "pre"/"post", the parts of
    ``outside``: the nodes before the first block and after the last) whose nodes use it."""
    places: dict[str, set[str]] = {}
    part_of = {node.name: part for part, nodes in outside.items() for node in nodes}
    for node in graph.nodes:
        where = node.layer if node.layer is not None else part_of.get(node.name)
        for name in node.param_names if where is not None else ():
            places.setdefault(name, set()).add(where)
    return {name: where for name, where in places.items() if len(where) > 1}


class TiedWeightSync:
    """The tied-weight sync of one graph on one profile (module docstring)."""

    def __init__(self, graph: Graph, profile: Profile, outside: dict[str, tuple[OpNode, ...]]):
        self.profile, self.params = profile, graph.parameters
        self.places = tied_places(graph, outside)

    def elements_by_stage(self, plan: Plan, chunks: list[list[str]], stages: list[StageTotals]) -> dict[int, float]:
        """Elements of tied weights each stage holding them all-reduces, as it holds them (module
        docstring); empty without a pipeline. ``chunks`` are the plan's pipeline chunks, ``stages``
        its priced stages (whose first and last blocks are the outside nodes, with their TP shards)."""
        if plan.pp == 1 or not self.places:
            return {}
        last = plan_last_stage(plan)  # pp - 1, or stage 0 in a V (types/layout.py)
        stage_of = {"pre": 0, "post": last, **stage_of_block(chunks, pp=plan.pp, v_shape=v_shaped(plan.schedule))}
        outside = (stages[0].blocks[0], stages[last].blocks[-1])
        held = {name: n for block in outside for name, n in zip(block.param_names, block.param_numels)}
        # autoplan/execute/tied.py reduces the local shard: FSDP's over dp x cp (cost/cp/weights.py)
        sharded = plan.dp * plan.cp if plan.zero_stage >= 2 else 1
        found: dict[int, float] = {}
        for name, where in self.places.items():
            holders = {stage_of[w] for w in where}
            if len(holders) > 1 and (name not in self.params or self.params[name].trainable):  # frozen: no grad
                elements = held.get(name, self.params[name].numel if name in self.params else 0.0) / sharded
                for stage in holders:
                    found[stage] = found.get(stage, 0.0) + elements
        return found

    def sync_s(self, plan: Plan, chunks: list[list[str]], stages: list[StageTotals], group: AxisGroup) -> float:
        """t_tied (module docstring) on the pp ``group``."""
        tied = max(self.elements_by_stage(plan, chunks, stages).values(), default=0.0)
        return collective_time_s(self.profile, "all_reduce", tied * 4, group=group) if tied else 0.0
