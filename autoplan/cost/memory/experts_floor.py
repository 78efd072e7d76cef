"""The routed experts' model states in the search's memory floors (docs/ilp.md, "Memory floor"), so a MoE plan whose
experts' states alone overflow is set aside unpriced.

CostModel charges stage k the states of its dense parameters and of its routed experts (cost/memory/plan.py
``PlanMemory._states``): the experts' E_k parameters a device holds (1/ep of each block's, cost/blocks.py
``expert_param_count``) at ``expert_states``, sharded over the edp ranks that hold the same experts. Those states are
linear in E_k (and in its trained part), and every block sits on some stage, so over the pp devices

    sum_k experts_k = expert_states(sum_b E_b)

which no partition changes: the states floor (cost/bounds.py) adds its mean over the stages, the in-flight and sends
floors (in_flight_floor.py, sent_floor.py) add it to the states they sum over the stages. E_b is read of the block
summaries at the bounds' floor context, whose placement is the plan's; the outside nodes hold no routed experts.
"""

from __future__ import annotations

from typing import Any

from autoplan.cost.cp.weights import weight_sync_plan
from autoplan.cost.memory.plan import expert_states
from autoplan.types.hsdp import shard_view
from autoplan.types.plan import Plan


class ExpertsFloor:
    """sum_k experts_k of the module docstring, bytes per device; ``stage_costs``: cost/bounds.py StageFacts. The
    blocks' expert parameters memoised per block summaries (by identity, holding them)."""

    def __init__(self, stage_costs: Any):
        self.stage_costs = stage_costs
        self._any = bool(stage_costs.cost_model.graph.moe_layers)  # else 0 at once: the search asks per member
        self._params: dict[int, tuple[Any, float, float]] = {}

    def states_bytes(self, plan: Plan) -> float:
        """Every block's routed experts' model states on one device, summed over ``plan``'s stages; 0 without any."""
        if not self._any or not (counts := self._expert_params(plan))[0]:
            return 0.0
        states = expert_states(shard_view(weight_sync_plan(plan)), params=counts[0], trainable=counts[1])
        return states.weights_bytes + states.grads_bytes + states.optimizer_bytes

    def _expert_params(self, plan: Plan) -> tuple[float, float]:
        """(sum_b E_b, its trained part) per device at the floor context's placement."""
        ctx = self.stage_costs.floor_context(plan)
        summaries = self.stage_costs.cost_model.block_summaries(plan.tp_plan, ctx, plan.tp_comm_overlap)
        if (hit := self._params.get(id(summaries))) is None or hit[0] is not summaries:
            blocks = summaries.values()
            params = sum(b.expert_param_count for b in blocks)
            trained = params - sum(b.frozen_expert_param_count for b in blocks)
            self._params[id(summaries)] = hit = (summaries, params, trained)
        return hit[1], hit[2]
