"""The floor of the data-parallel sync a plan exposes whatever the overlap, for the search's bounds
(cost/bounds.py, docs/ilp.md "Bounds"): each message of cost/dp/messages.py at its floor bytes per
parameter (frozen parameters at most left out, HSDP's replica all-reduce on its own group), stage 0's
first block's gradient sync, ZeRO-3's prefetched gathers f t_fwd + (g - s) t_bwd_gather + s
t_bwd_gather+scatter over every block under cp, and ZeRO-1/2's all-gather of the updated weights.
"""

from __future__ import annotations

from typing import Any, Callable

from autoplan.cost.cp.weights import weight_sync_plan
from autoplan.cost.dp.messages import (
    BACKWARD,
    EACH,
    FORWARD,
    GRADS,
    WEIGHTS,
    DpMessage,
    dp_messages,
    find,
    replica_messages,
)
from autoplan.cost.network.comm import BucketedTimes
from autoplan.cost.pp.schedule import prefetched_exposed_s
from autoplan.types.plan import Plan
from autoplan.types.profile import Profile


class SyncFloors:
    """The dp sync's floors (module docstring), from explicit inputs: the profile, the stages' facts
    (cost/bounds.py StageFacts), the plan's mesh groups and the trainable floor of a parameter count."""

    def __init__(
        self,
        profile: Profile,
        stage_costs: Any,
        *,
        mesh: Callable[[Plan], dict],
        trained_floor: Callable[[float], float],
    ):
        self.profile, self.stage_costs = profile, stage_costs
        self.mesh, self.trained_floor = mesh, trained_floor
        self._zero3: dict[tuple, tuple] = {}
        self._bucketed = BucketedTimes(profile)

    def message_s(self, message: DpMessage, params: float, plan: Plan) -> float:
        """CostModel's price of one unit's dp ``message`` of ``params`` parameters (DataParallelTerms.message_s),
        at its floor bytes per parameter (DpMessage.floor_bytes_per_param)."""
        group = self.mesh(plan)["dp_shard"]  # ZeRO's messages: HSDP's shard group, else dp x cp
        params = message.sent(params, params - self.trained_floor(params))  # frozen ones at most
        size = params * message.floor_bytes_per_param(plan.precision)
        return self._bucketed(message.kind, size, group, message.bucket_bytes)

    def replicas_s(self, messages: tuple[DpMessage, ...], params: float, plan: Plan) -> float:
        """HSDP's all-reduces of one unit's 1/S gradient shard across the replicas, after its reduce-scatter
        (cost/dp/messages.py), at their floor bytes on the replicate group; 0 without HSDP."""
        group, frozen = self.mesh(plan)["dp_replicate"], params - self.trained_floor(params)  # frozen ones at most
        total = 0.0
        for m in replica_messages(messages):
            size = m.unit_bytes(m.sent(params, frozen)) * m.floor_bytes_per_param(plan.precision) / m.bytes_per_param
            total += self._bucketed(m.kind, size, group, m.bucket_bytes)
        return total

    def sync_s(self, plan: Plan, messages: tuple[DpMessage, ...] | None = None) -> float:
        """The gradient sync stage 0's first block exposes whatever the overlap, per the dp messages
        (cost/dp/messages.py; ``messages``: :func:`weights_messages` of ``plan`` where the caller has them): under
        ZeRO-3 its forward gathers, and where gradients are reduce-scattered every micro-batch the smallest block's
        gather + reduce-scatter too."""
        messages = weights_messages(plan) if messages is None else messages
        if not messages or plan.grad_compression != "none":  # PowerSGD's factors: bounded below by 0
            return 0.0
        first, smallest = self.stage_costs.sync_params(plan)
        grads = find(messages, GRADS)
        gather = find(messages, WEIGHTS, FORWARD)
        if gather is None:
            return self.message_s(grads, first, plan) + self.replicas_s(messages, first, plan)
        floor = gather.times_per_step(plan.num_microbatches) * self.message_s(gather, first, plan)
        if grads.micro_batches == EACH:  # a pipeline stage gathers in the first forward only, scatters once
            regather = find(messages, WEIGHTS, BACKWARD)
            backward = self.message_s(regather, smallest, plan) + self.message_s(grads, smallest, plan)
            backward += self.replicas_s(messages, smallest, plan)
            floor += gather.times_per_step(plan.num_microbatches) * backward
        return max(floor, self.zero3_blocks_s(plan, messages)) if plan.cp > 1 else floor

    def zero3_blocks_s(self, plan: Plan, messages: tuple[DpMessage, ...]) -> float:
        """ZeRO-3's exposed gathers and reduce-scatters of a one-stage plan, every block of it: CostModel's
        f t_fwd + (g - s) t_bwd_gather + s t_bwd_gather+scatter (cost/dp/sync.py:_zero3_exposed_s) over the
        blocks it will price, with each block's messages at their floor bytes (dense parameters only) and
        overlap efficiency 1, the most any block hides behind the one before it (cost/pp/schedule.py:
        prefetched_exposed_s falls as efficiency rises). Under cp each block computes 1/cp of the tokens
        but gathers all its weights, so every block's gather shows, not only the first's."""
        blocks = self.stage_costs.single_stage_blocks(plan)
        key = (
            id(blocks),
            messages,
            plan.num_microbatches,
            plan.dp,
            plan.dp_replicate,
            plan.tp,
            plan.cp,
            plan.precision,
        )
        hit = self._zero3.get(key)
        if hit is None or hit[0] is not blocks:  # the entry holds ``blocks``, so its id is not reused meanwhile
            hit = self._zero3[key] = (blocks, self._zero3_exposed_floor_s(plan, messages, blocks))
        return hit[1]

    def _zero3_exposed_floor_s(self, plan: Plan, messages: tuple[DpMessage, ...], blocks: tuple) -> float:
        """The floor of zero3_blocks_s. At pp = 1 the one stage runs ``blocks`` in this order; at pp > 1
        each block's message hides behind at most the slowest block's compute, and the slowest stage
        exposes at least the mean over the pp stages, whatever the partition."""
        forward, backward, grads = (
            find(messages, WEIGHTS, FORWARD),
            find(messages, WEIGHTS, BACKWARD),
            find(messages, GRADS),
        )
        dense = [b.param_count - b.expert_param_count for b in blocks]
        sizes = {
            n: (self.message_s(forward, n, plan), self.message_s(backward, n, plan), self.message_s(grads, n, plan))
            for n in set(dense)
        }
        gather = [sizes[n][0] for n in dense]
        regather = [sizes[n][1] for n in reversed(dense)]
        both = [sizes[n][1] + sizes[n][2] for n in reversed(dense)]
        f, g, s = (msg.times_per_step(plan.num_microbatches) for msg in (forward, backward, grads))
        if g < s:  # CostModel subtracts the gathers' share, which the floor cannot bound from below
            return 0.0
        fwd_compute, bwd_compute = [b.fwd_s for b in blocks], [b.bwd_s for b in reversed(blocks)]
        if plan.pp == 1:
            exposed = prefetched_exposed_s
        else:
            exposed = _unordered_exposed_s(plan.pp)
        fwd = exposed(compute_s=fwd_compute, comm_s=gather)
        bwd_last = exposed(compute_s=bwd_compute, comm_s=both)
        bwd_gather = exposed(compute_s=bwd_compute, comm_s=regather) if g > s else 0.0
        return f * fwd + (g - s) * bwd_gather + s * bwd_last

    def zero_gather_s(self, plan: Plan, stage_params: float, messages: tuple[DpMessage, ...] | None = None) -> float:
        """ZeRO-1/2's all-gather of the updated weights (not ZeRO-3's, which gather per block); ``messages`` as
        :meth:`sync_s`'s."""
        weights = find(weights_messages(plan) if messages is None else messages, WEIGHTS)
        if weights is None or weights.phase == FORWARD:
            return 0.0
        return self.message_s(weights, stage_params, plan)


def weights_messages(plan: Plan) -> tuple[DpMessage, ...]:
    """The dp messages of ``plan`` as its weights see it (dp x cp ranks, cost/cp/weights.py), which the floors price."""
    return dp_messages(weight_sync_plan(plan))


def _unordered_exposed_s(pp: int):
    """prefetched_exposed_s's floor on the slowest of ``pp`` stages under any partition: block i's message
    shows at least max(0, comm_i - the slowest compute) at efficiency <= 1, and the slowest stage at least
    the mean of the stages' sums."""

    def exposed_s(*, compute_s: list[float], comm_s: list[float]) -> float:
        slowest = max(compute_s, default=0.0)
        return sum(max(0.0, t - slowest) for t in comm_s) / pp

    return exposed_s
