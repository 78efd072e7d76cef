"""Lower bounds on what CostModel charges a plan, so the search can skip what cannot win.

Each term is one of CostModel's own step-time terms (autoplan/cost/model.py) evaluated at a
value it can never go below, so a bound never exceeds the priced step time (a test checks
this for every priced candidate):

- ``compute_min_s``: forward + backward of one micro-batch with every op divided tp ways and no
  communication (op time falls as the shard grows: F/(peak*eff(F)) = (F + F_half)/(peak*a));
- ``pp_comm_s``: the send/recv term (v m + p - 1) (t_p2p(forward) + t_p2p(backward)) with the
  smallest block inputs, all of them forward and those that need a gradient backward;
- ``step_extras_s``: Adam on the largest stage's parameters (28 bytes per local parameter),
  the ZeRO-1/2 all-gather of the updated weights, and the gradient sync that is exposed on
  stage 0 whatever the overlap: its first block (the modules before the first layer)
  finishes its backward last, so that block's own sync shows; under ZeRO-3, per micro-batch,
  that block's weight all-gather (forward) and the smallest block's gather + reduce-scatter
  (backward) are prefetched behind nothing; in a pipeline, whose stages gather once in the first
  forward and reduce-scatter once after the last backward, only that first gather.

One bound is on memory, not time: ``states_floor_bytes``, the weights, gradients and optimizer
state (cost/memory.model_states) of the fewest parameters the fullest pipeline stage can hold
under any partition, (blocks + the larger of the parts before and after the blocks) / pp (the
smaller part is dropped: with one stage it may be the tied copy the stage holds once). CostModel's
peak is W + O + max(M1, M2, M3) >= W + O + G (cost/memory.stage_memory), so a plan whose floor
exceeds the usable memory cannot fit whatever its partition (a test checks floor <= peak for every
priced candidate).
"""

from __future__ import annotations

from autoplan.cost.comm import bucketed_time_s, collective_time_s
from autoplan.cost.compute import PRECISION_BYTES, memory_time_s
from autoplan.cost.memory import DDP_BUCKET_BYTES, STATE_BYTES, model_states, runs_ddp
from autoplan.cost.mesh import mesh_groups
from autoplan.cost.model import ADAM_BYTES_PER_PARAM
from autoplan.cost.op_costs import node_time_s
from autoplan.solve.stage_costs import StageCosts
from autoplan.types.graph import Graph
from autoplan.types.plan import Plan
from autoplan.types.profile import Profile


class Bounds:
    def __init__(self, graph: Graph, profile: Profile, stage_costs: StageCosts):
        self.graph, self.profile, self.stage_costs = graph, profile, stage_costs
        self._c_min: dict[tuple, float] = {}

    def compute_min_s(self, *, tp: int, precision: str, mbs: int) -> float:
        """C_min (one block per group of identical blocks, times the group size)."""
        key = (tp, precision, mbs)
        if key not in self._c_min:
            f = mbs / self.graph.batch_size

            def nodes_s(nodes) -> float:
                return sum(
                    node_time_s(self.graph, n, self.profile, precision=precision, batch_fraction=f, shard=tp)
                    for n in nodes
                )

            total = nodes_s(self.graph.layer_nodes(None))
            total += sum(
                len(group.layers) * nodes_s(self.graph.layer_nodes(group.layers[0])) for group in self.graph.groups
            )
            self._c_min[key] = total
        return self._c_min[key]

    def states_floor_bytes(self, plan: Plan) -> float:
        """The memory floor of the module docstring, bytes per device."""
        pre, post, blocks = self.stage_costs.param_parts(plan)
        states = model_states(
            params=(blocks + max(pre, post)) / plan.pp,
            precision=plan.precision,
            zero_stage=plan.zero_stage,
            dp=plan.dp,
            pp=plan.pp,
        )
        return states.weights_bytes + states.grads_bytes + states.optimizer_bytes

    def pp_comm_s(self, plan: Plan) -> float:
        if plan.pp == 1:
            return 0.0
        scatter = plan.tp > 1 and not plan.sequence_parallel
        group = mesh_groups(self.profile, dp=plan.dp, tp=plan.tp, pp=plan.pp)["pp"]
        t_p2p = sum(
            collective_time_s(self.profile, "send_recv", size / plan.tp if scatter else size, group=group)
            for size in self.stage_costs.min_boundary_bytes(plan)
            if size
        )
        return (plan.virtual_stages * plan.num_microbatches + plan.pp - 1) * t_p2p

    def step_extras_s(self, plan: Plan, *, stage_params: float) -> float:
        return (
            self.optimizer_s(plan, stage_params=stage_params)
            + self._zero_gather_s(plan, stage_params)
            + self._sync_s(plan)
        )

    def optimizer_s(self, plan: Plan, *, stage_params: float) -> float:
        return self.adam_s(stage_params / (plan.dp if plan.zero_stage >= 1 else 1))

    def adam_s(self, local_params: float) -> float:
        """CostModel's memory-bound Adam step over ``local_params`` parameters."""
        return memory_time_s(self.profile, local_params * ADAM_BYTES_PER_PARAM)

    def _bucketed_s(self, kind: str, message_bytes: float, plan: Plan) -> float:
        """CostModel's dp collective (CostModel._dp_message_s): DDP buckets under DDP, else one call."""
        if plan.dp == 1:
            return 0.0
        group = mesh_groups(self.profile, dp=plan.dp, tp=plan.tp, pp=plan.pp)["dp"]
        return bucketed_time_s(
            self.profile, kind, message_bytes, group=group, bucket_bytes=DDP_BUCKET_BYTES if runs_ddp(plan) else None
        )

    def _sync_s(self, plan: Plan) -> float:
        if plan.dp == 1:
            return 0.0
        weight, grad, _ = STATE_BYTES[plan.precision]
        first, smallest = self.stage_costs.sync_params(plan)
        if plan.zero_stage < 3:
            return self._bucketed_s("all_reduce" if plan.zero_stage == 0 else "reduce_scatter", first * grad, plan)
        if plan.pp > 1:  # a pipeline stage gathers in the first forward only, and scatters once (cost/dp_sync.py)
            return self._bucketed_s("all_gather", first * weight, plan)
        backward = self._bucketed_s("all_gather", smallest * weight, plan) + self._bucketed_s(
            "reduce_scatter", smallest * grad, plan
        )
        return plan.num_microbatches * (self._bucketed_s("all_gather", first * weight, plan) + backward)

    def _zero_gather_s(self, plan: Plan, stage_params: float) -> float:
        if plan.zero_stage not in (1, 2) or plan.dp == 1:
            return 0.0
        return self._bucketed_s("all_gather", stage_params * PRECISION_BYTES[plan.precision], plan)
