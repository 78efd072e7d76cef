"""Data-parallel gradient sync and ZeRO traffic, priced from cost/dp/messages.py's statement.

- dp_exposed: the gradient sync overlapped with the last micro-batch's backward, block by block in
  reverse (DDP's buckets, Li et al. VLDB'20), stage i with i backward slots of slack; exposed only
  where the executor overlaps it (DDP at tp = pp = 1, FSDP2 under ZeRO-2/3) and never under
  ``overlap_grad_reduce=False``; plus ZeRO-1/2's weight all-gather (per block under the next
  forward with ``overlap_param_gather``), DDP's buffer broadcast and the experts' after-backward sync;
- zero_exposed (ZeRO-3): gathers and reduce-scatters prefetched one block ahead,
  f t_fwd + (g - s) t_bwd_gather + s t_bwd_gather+scatter with f, g, s the statement's repetitions;
- ``schedule_steps`` k > 1: a pipeline's once-a-schedule-step messages (ZeRO-2/3's reduce-scatter, ZeRO-3's
  first-forward gather) are sent k times, each priced (total and exposed) as the one schedule step's;
- PowerSGD: three all-reduces per bucket, its own compute added whole (``compression_s``); top-k
  (cost/dp/topk.py): one all-gather of (index, value) pairs per bucket, its selection added whole;
- sparse embedding tables (cost/dp/sparse_embedding.py): out of the dense buckets, their touched rows
  all-gathered (indices, values) with the block that holds them;
- HSDP (cost/dp/messages.py): each block's gradient message is its reduce-scatter over the shard
  group followed by the all-reduce of its 1/S shard over the replicate group, on that group's links;
- overlap efficiency eta (profile ``comm_overlap``): exposed(eta) = exposed(1) + (1 - eta)(total -
  exposed(1)); eta = 0 for FSDP2 without CUDA streams.

docs/cost-model.md, "Step time" states each term with its source. :class:`DataParallelTerms` prices
them from explicit inputs (profile, graph, plan, stage totals, dp and edp groups) with its own memo;
a block's messages are priced once per distinct summary (cost/blocks.py per_distinct) and the price
listed for each block it stands for, so every sum and overlap runs in the blocks' order, bit for bit.
"""

from __future__ import annotations

from autoplan.cost.blocks import per_distinct
from autoplan.cost.dp import compression, sparse_embedding, topk
from autoplan.cost.dp.messages import (
    BACKWARD,
    FORWARD,
    GRADS,
    LAST,
    NEXT_FORWARD,
    WEIGHTS,
    DpMessage,
    buffer_broadcast,
    dp_messages,
    expert_messages,
    find,
    replica_messages,
)
from autoplan.cost.network.comm import BucketedTimes, collective_time_s
from autoplan.cost.network.mesh import AxisGroup
from autoplan.cost.pp.schedule import overlapped_sync_exposed_s, partially_hidden_s, prefetched_exposed_s
from autoplan.cost.stages import StageTotals
from autoplan.types.cost import Cost
from autoplan.types.expert_layout import experts_apart
from autoplan.types.graph import Graph
from autoplan.types.plan import Plan
from autoplan.types.profile import Profile


class DataParallelTerms:
    """The dp and ZeRO terms of the step time (module docstring), memoised per message."""

    def __init__(self, profile: Profile, graph: Graph):
        self.profile, self.graph = profile, graph
        self._memo: dict[tuple, object] = {}
        self._bucketed = BucketedTimes(profile)
        self.sparse = sparse_embedding.sparse_tables(graph)  # tables DDP syncs as sparse rows

    def price(
        self,
        cost: Cost,
        plan: Plan,
        stages: list[StageTotals],
        *,
        group: AxisGroup,
        edp: AxisGroup,
        replicate: AxisGroup | None = None,
    ) -> None:
        """Set ``cost``'s dp_comm_s, dp_comm_exposed_s, compression_s and zero_comm_s; ``group`` is
        the dp group (HSDP's shard group), ``edp`` the routed experts' (any group at ep = 1: unused
        there), ``replicate`` HSDP's replicate group (None without HSDP)."""
        if plan.dp == 1 or not dp_messages(plan):  # local SGD without HSDP: nothing syncs per step
            return
        groups = (group, replicate or group)  # without HSDP no message goes to the replicate group
        if plan.zero_stage >= 3:
            cost.zero_comm_s = max(self._zero3_exposed_s(plan, s, groups, edp) for s in stages)
            return
        self._dp_time(cost, plan, stages, groups, edp)
        self._compression_time(cost, plan, stages)

    def collective_s(self, kind: str, message_bytes: float, group: AxisGroup, bucket_bytes: float | None) -> float:
        """comm.bucketed_time_s, memoised: identical blocks and parameters send identical messages."""
        return self._bucketed(kind, message_bytes, group, bucket_bytes)

    def message_s(self, message: DpMessage, message_bytes: float, group: AxisGroup) -> float:
        """One unit's ``message`` of ``message_bytes``: in DDP buckets or one call (comm.bucketed_time_s)."""
        return self.collective_s(message.kind, message_bytes, group, message.bucket_bytes)

    def least_exposed_s(self, plan: Plan, message: DpMessage, total_s: float) -> float:
        """The least of ``total_s`` of one ``message`` the step charges, whatever the stages: all of it where it is
        never hidden (after the backward, as ZeRO-0/1's sync at tp or pp > 1, or after the step), else the part
        ``(1 - eta) total_s`` no overlap hides (partially_hidden_s with nothing exposed at perfect overlap): the
        backward's overlapped sync, FSDP2's prefetched gathers and reduce-scatters (module docstring)."""
        hidden = plan.zero_stage >= 3 or message.phase == NEXT_FORWARD
        hidden = hidden or (message.payload == GRADS and self._overlaps_grad_reduce(plan, message))
        if not hidden:
            return total_s
        return partially_hidden_s(exposed_s=0.0, total_s=total_s, efficiency=self._overlap_efficiency(plan))

    def _block_s(
        self, plan: Plan, message: DpMessage, block, group: AxisGroup, edp: AxisGroup, *, experts: bool = True
    ) -> float:
        """One block's ``message``: its dense parameters over the dp group, its routed experts'
        (1/ep of them) over edp (autoplan/cost/moe/placement.py), unless ``experts`` is False."""
        frozen_dense = block.frozen_param_count - block.frozen_expert_param_count
        if message.payload == GRADS:  # sparse tables leave the dense buckets (cost/dp/sparse_embedding.py)
            frozen_dense += sparse_embedding.sparse_params(self.sparse, block.param_names)
        dense = message.unit_bytes(
            message.sent(block.param_count - block.expert_param_count, frozen_dense), block.fp8_params
        )
        held = message.sent(block.expert_param_count, block.frozen_expert_param_count)
        expert = held * message.bytes_per_param if experts else 0.0
        return self._split_s(plan, message, dense, expert, group, edp)

    def _split_s(
        self, plan: Plan, message: DpMessage, dense_bytes: float, expert_bytes: float, group: AxisGroup, edp: AxisGroup
    ) -> float:
        """``message`` of dense bytes over ``group`` plus, under ep > 1, of the experts' bytes over
        edp (at ep = 1 they travel together)."""
        if not experts_apart(plan):
            return self.message_s(message, dense_bytes + expert_bytes, group)
        return self.message_s(message, dense_bytes, group) + self.message_s(message, expert_bytes, edp)

    def _apart_s(self, plan: Plan, stages: list[StageTotals], edp: AxisGroup) -> tuple[float, bool]:
        """The routed experts' flat all-reduce after the backward (messages.expert_messages, zero 0:
        DDP ignores them), the slowest stage's, exposed; and whether the experts sync apart."""
        apart = find(expert_messages(plan), GRADS)
        if apart is None or not apart.apart:
            return 0.0, False
        return max(self.message_s(apart, s.trainable_expert_params * apart.bytes_per_param, edp) for s in stages), True

    def _replicas_s(self, plan: Plan, messages: tuple, block, replicate: AxisGroup) -> float:
        """HSDP's all-reduces of one block's gradient shard across the replicas (0 without HSDP)."""
        return sum(self._block_s(plan, m, block, replicate, replicate) for m in replica_messages(messages))

    def _dp_time(
        self, cost: Cost, plan: Plan, stages: list[StageTotals], groups: tuple[AxisGroup, AxisGroup], edp: AxisGroup
    ) -> None:
        group, replicate = groups
        messages = dp_messages(plan, backend=self.profile.backend)
        grads, eta = find(messages, GRADS), self._overlap_efficiency(plan)
        slowest = max(stages, key=lambda s: s.micro_batch_s)
        slot_s = slowest.bwd_s + slowest.recompute_s
        exposed, total = 0.0, 0.0
        after, apart = self._apart_s(plan, stages, edp)
        for index, stage in enumerate(stages):
            full = plan.recompute == "full"  # a block recomputed in full re-runs its forward in its backward slot
            rerun = [b.fwd_s if full and again else 0.0 for b, again in zip(stage.blocks, stage.recomputed)]
            backward = [b.bwd_s + r for b, r in zip(reversed(stage.blocks), reversed(rerun))]
            sync = self._grad_syncs_s(plan, grads, stage, group, edp, experts=not apart)
            if plan.dp_replicate > 1:  # each block's shard all-reduced across the replicas after its reduce-scatter
                replicas = per_distinct(stage.blocks, lambda b: self._replicas_s(plan, messages, b, replicate))
                sync = [s + r for s, r in zip(sync, reversed(replicas))]
            total = max(total, sum(sync))
            perfect = max(0.0, overlapped_sync_exposed_s(backward_s=backward, sync_s=sync) - index * slot_s)
            exposed = max(exposed, partially_hidden_s(exposed_s=perfect, total_s=sum(sync), efficiency=eta))
        repeats = grads.times_per_step(plan.num_microbatches)
        if repeats > 1 and grads.micro_batches == LAST:  # once per schedule step, each as the last (messages.py)
            total, exposed = repeats * total, repeats * exposed
        elif repeats > 1:  # reduce-scattered every micro-batch, the earlier ones under their backward
            earlier = (repeats - 1) * total
            total, exposed = total + earlier, exposed + earlier * (1.0 - eta)
        total, exposed = total + after, exposed + after
        gather_s, gather_exposed_s = self._weight_gather_s(plan, find(messages, WEIGHTS), stages, group, edp)
        if not self._overlaps_grad_reduce(plan, grads):
            exposed = total
        total, exposed = total + gather_s, exposed + gather_exposed_s
        broadcast = buffer_broadcast(plan, self.graph.buffer_bytes, self.graph.buffer_dtypes)
        if broadcast:  # each message priced as an all-gather of its bytes (messages.buffer_broadcast); never hidden
            each = broadcast.message_bytes / broadcast.count
            broadcast_s = broadcast.count * collective_time_s(self.profile, "all_gather", each, group=group)
            total, exposed = total + broadcast_s, exposed + broadcast_s
        cost.dp_comm_s, cost.dp_comm_exposed_s = total, max(0.0, exposed)

    def _weight_gather_s(
        self, plan: Plan, weights: DpMessage | None, stages: list[StageTotals], group: AxisGroup, edp: AxisGroup
    ) -> tuple[float, float]:
        """ZeRO-1/2's all-gather of the updated weights and its exposed part: all of it after the
        step, or per block prefetched under the next first forward (module docstring). (0, 0) without."""
        if weights is None:
            return 0.0, 0.0
        size = weights.bytes_per_param
        if weights.phase != NEXT_FORWARD:
            fullest = max(stages, key=lambda s: weights.sent(s.params, s.frozen_params))
            dense = weights.sent(fullest.dense_params, fullest.frozen_params - fullest.frozen_expert_params)
            expert = weights.sent(fullest.expert_params, fullest.frozen_expert_params)
            gather = self._split_s(plan, weights, dense * size, expert * size, group, edp)
            return gather, gather
        eta, total, exposed = self._overlap_efficiency(plan), 0.0, 0.0
        for stage in stages:
            gathers = per_distinct(stage.blocks, lambda b: self._block_s(plan, weights, b, group, edp))
            forward = [b.fwd_s for b in stage.blocks]
            total = max(total, sum(gathers))
            exposed = max(exposed, prefetched_exposed_s(compute_s=forward, comm_s=gathers, efficiency=eta))
        return total, exposed

    def _grad_syncs_s(
        self, plan: Plan, grads: DpMessage, stage: StageTotals, group: AxisGroup, edp: AxisGroup, *, experts: bool
    ) -> list:
        """Each block's gradient message, last block first (without the routed experts' when
        ``experts`` is False), or PowerSGD's three all-reduces per bucket."""
        if not grads.compressed:
            each = per_distinct(
                stage.blocks,
                lambda b: self._block_s(plan, grads, b, group, edp, experts=experts) + self._sparse_s(plan, b, group),
            )
            return each[::-1]
        bucket = grads.bucket_bytes
        if plan.grad_compression == "topk":
            found = self.topk_traffics(stage.blocks, plan.topk_ratio, group.size)
            return [topk.sync_s(self.profile, t, group=group, bucket_bytes=bucket) for t in found[::-1]]
        traffics = self.powersgd_traffics(stage.blocks, plan.powersgd_rank)
        return [compression.sync_s(self.profile, t, group=group, bucket_bytes=bucket) for t in traffics[::-1]]

    def _sparse_s(self, plan: Plan, block, group: AxisGroup) -> float:
        """The all-gathers of the sparse tables ``block`` holds (cost/dp/sparse_embedding.py); 0 without."""
        if not self.sparse:
            return 0.0
        inside = set(block.param_names)
        tables = tuple(t for t in self.sparse if t.name in inside)
        return sparse_embedding.sync_s(self.profile, tables, plan, group) if tables else 0.0

    def topk_traffics(self, blocks: list, ratio: float, ranks: int) -> list[topk.TopKTraffic]:
        """The blocks' top-k traffic (topk.blocks_traffic), memoised by their parameters."""
        key = ("topk", tuple(b.param_names for b in blocks), ratio, ranks)
        hit = self._memo.get(key)
        if hit is None:
            names = compression.distinct_names(blocks)
            hit = self._memo[key] = topk.blocks_traffic(self.graph, names, ratio, ranks)
        return hit

    def powersgd_traffics(self, blocks: list, rank: int) -> list[compression.PowerSGDTraffic]:
        """The blocks' PowerSGD traffic (compression.blocks_traffic), memoised by their parameters."""
        key = ("powersgd", tuple(b.param_names for b in blocks), rank)
        hit = self._memo.get(key)
        if hit is None:
            hit = self._memo[key] = compression.blocks_traffic(self.graph, blocks, rank)
        return hit

    def powersgd_stage(self, plan: Plan, stage: StageTotals) -> compression.PowerSGDTraffic | topk.TopKTraffic:
        """A stage's compressed-gradient traffic: PowerSGD's, or top-k's under grad_compression 'topk' (both
        say sent_bytes, held_bytes and hook_bytes); all zeros when the plan does not compress (so every
        term of it, sent, computed or held, is 0)."""
        if plan.grad_compression == "topk" and plan.dp > 1:
            ranks = plan.dp * plan.cp  # DDP's group: the dp x cp ranks (types/plan.py runs_ddp)
            return topk.total(self.topk_traffics(stage.blocks, plan.topk_ratio, ranks), ranks)
        if plan.grad_compression != "powersgd" or plan.dp == 1:
            return compression.PowerSGDTraffic()
        return compression.total(self.powersgd_traffics(stage.blocks, plan.powersgd_rank))

    def _compression_time(self, cost: Cost, plan: Plan, stages: list[StageTotals]) -> None:
        """PowerSGD's own work on the slowest stage's rank (compression.compute_s); 0 without it."""
        if plan.grad_compression == "powersgd" and plan.dp > 1:
            cost.compression_s = max(compression.compute_s(self.profile, self.powersgd_stage(plan, s)) for s in stages)
        if plan.grad_compression == "topk" and plan.dp > 1:
            cost.compression_s = max(topk.compute_s(self.profile, self.powersgd_stage(plan, s)) for s in stages)

    def _overlaps_grad_reduce(self, plan: Plan, grads: DpMessage) -> bool:
        """Whether the gradient reduction runs under the backward (module docstring): sent in the
        backward, and not PowerSGD under gloo (the executor finishes each bucket's hook first)."""
        if not plan.overlap_grad_reduce or grads.phase != BACKWARD:
            return False
        return not (grads.compressed and self.profile.backend != "nccl")

    def _overlap_efficiency(self, plan: Plan) -> float:
        """eta of the dp communication (module docstring): 0 for FSDP2 (ZeRO-2/3) without CUDA streams."""
        if plan.zero_stage >= 2 and self.profile.backend != "nccl":
            return 0.0
        return self.profile.comm_overlap.efficiency

    def _zero3_exposed_s(
        self, plan: Plan, stage: StageTotals, groups: tuple[AxisGroup, AxisGroup], edp: AxisGroup
    ) -> float:
        """FSDP2's exposed gathers and reduce-scatters (and HSDP's replica all-reduces) on ``stage``
        (module docstring)."""
        group, replicate = groups
        messages = dp_messages(plan, backend=self.profile.backend)
        eta, m = self._overlap_efficiency(plan), plan.num_microbatches
        forward, backward = find(messages, WEIGHTS, FORWARD), find(messages, WEIGHTS, BACKWARD)
        grads = find(messages, GRADS)
        blocks = stage.blocks
        gather = per_distinct(blocks, lambda b: self._block_s(plan, forward, b, group, edp))
        regather = per_distinct(blocks, lambda b: self._block_s(plan, backward, b, group, edp))[::-1]
        scatter = per_distinct(
            blocks, lambda b: self._block_s(plan, grads, b, group, edp) + self._replicas_s(plan, messages, b, replicate)
        )[::-1]
        fwd = prefetched_exposed_s(compute_s=[b.fwd_s for b in blocks], comm_s=gather, efficiency=eta)
        bwd_compute = [b.bwd_s for b in reversed(blocks)]
        both = [g + s for g, s in zip(regather, scatter)]
        bwd_last = prefetched_exposed_s(compute_s=bwd_compute, comm_s=both, efficiency=eta)
        f, g, s = (msg.times_per_step(m) for msg in (forward, backward, grads))
        if g == s:
            return f * fwd + s * bwd_last
        bwd_gather = prefetched_exposed_s(compute_s=bwd_compute, comm_s=regather, efficiency=eta)
        return f * fwd + (g - s) * bwd_gather + s * bwd_last
