"""Where a plan's MoE experts sit, and the two data-parallel groups their parameters sync over.

Expert parallelism folds ``ep`` over the data-parallel ranks (autoplan/types/plan.py), and with tp > 1
or ``expert_tp`` the experts' layout ``expert_tp x ep x edp`` over a stage's ranks (types/expert_layout.py):

- dense parameters are replicated (or ZeRO-sharded) over all ``dp`` ranks;
- the routed experts' parameters, ``1 / ep`` of them per rank, over the ``dp / ep`` ranks that hold
  the same experts (the "edp" group, cost/network/mesh.py ``ep_groups``; Megatron-Core's expert data
  parallel group, torchtitan's ``dp_mod_ep`` mesh).

The placement sets the imbalance ``i``: the routing model's at ep > 1 (the busiest rank sets the
pace), 1 at ep = 1. Per-block times and the all-to-alls are in cost/moe/experts.py.
"""

from __future__ import annotations

from dataclasses import replace

from autoplan.cost.moe.experts import ExpertPlacement
from autoplan.cost.network.mesh import AxisGroup, ep_groups
from autoplan.cost.stages import StageTotals
from autoplan.types.expert_layout import expert_dp
from autoplan.types.graph import Graph
from autoplan.types.moe import RoutingModel
from autoplan.types.plan import Plan
from autoplan.types.profile import Profile


class ExpertGroups:
    """The experts' placement and edp group for one graph on one profile (module docstring)."""

    def __init__(self, graph: Graph, profile: Profile):
        self.moe_layers, self.profile = graph.moe_layers, profile
        self._placements: dict[tuple, ExpertPlacement | None] = {}  # one (frozen) placement per its arguments

    def for_plan(self, plan: Plan) -> ExpertPlacement | None:
        """How ``plan`` runs the experts; None for a dense model or under tensor parallelism without the
        experts' own layout (its expert matmuls are then priced as the ops they trace to, token-wise)."""
        return self.placement(
            tp=plan.tp, dp=plan.dp, ep=plan.ep, pp=plan.pp, routing=plan.routing, expert_tp=plan.expert_tp,
            runtime=plan.runtime,
        )  # fmt: skip

    def placement(
        self, *, tp: int, dp: int, ep: int, pp: int, routing: RoutingModel | None, expert_tp: int = 1,
        runtime: str = "autoplan",
    ) -> ExpertPlacement | None:  # fmt: skip
        """:meth:`for_plan` of a plan with these degrees and routing model (the search's bounds ask
        before any plan is built). At tp > 1 the layout folds over the tp ranks, each routing its
        sequence shard (types/expert_layout.py: it needs sequence parallelism there). Memoised on the
        arguments: the search asks again per candidate plan, and a block's memo keys hash the placement."""
        key = (tp, dp, ep, pp, routing, expert_tp, runtime)
        if key not in self._placements:
            found = self._placement(tp=tp, dp=dp, ep=ep, pp=pp, routing=routing, expert_tp=expert_tp)
            # autoplan's executor weights the combined rows outside the experts module (cost/moe/experts.py)
            self._placements[key] = found and replace(found, weights_combined=runtime == "autoplan")
        return self._placements[key]

    def _placement(
        self, *, tp: int, dp: int, ep: int, pp: int, routing: RoutingModel | None, expert_tp: int
    ) -> ExpertPlacement | None:
        if not self.moe_layers or (tp > 1 and ep * expert_tp == 1):
            return None
        one = AxisGroup(size=1, ranks_per_node=1)
        groups = ep_groups(self.profile, dp=dp, ep=ep, pp=pp, tp=tp, expert_tp=expert_tp)
        imbalance = (routing or self.moe_layers[0].routing).imbalance if ep > 1 else 1.0
        return ExpertPlacement(
            ep=ep,
            imbalance=imbalance,
            group=groups["ep"] if ep > 1 else one,
            etp=expert_tp,
            etp_group=groups["etp"],
            tokens=1.0 / tp,
        )

    def edp_group(self, plan: Plan) -> AxisGroup:
        """The group an expert's gradients are reduced over (the dp group's ranks at ep = 1)."""
        return ep_groups(self.profile, dp=plan.dp, ep=plan.ep, pp=plan.pp, tp=plan.tp, expert_tp=plan.expert_tp)["edp"]


def optimizer_params(plan: Plan, stage: StageTotals) -> float:
    """Trainable parameters whose optimizer step runs on one device: all, or their ZeRO shards
    (dense over dp, the routed experts over dp / ep; ZeRO, Rajbhandari et al. 2020); frozen ones
    take no step."""
    if plan.zero_stage < 1:
        return stage.trainable_params
    return dense_optimizer_params(plan, stage.trainable_dense_params) + stage.trainable_expert_params / expert_dp(plan)


def dense_optimizer_params(plan: Plan, trainable_dense: float) -> float:
    """Of ``trainable_dense`` dense trainable parameters, those whose optimizer step runs on one device: all, or
    their 1/dp ZeRO shard (:func:`optimizer_params`)."""
    return trainable_dense if plan.zero_stage < 1 else trainable_dense / plan.dp
