"""Data-parallel gradient sync and ZeRO traffic, as CostModel prices them (docs/cost-model.md).

- dp_exposed: bucketed gradient all-reduce (reduce-scatter + all-gather of the updated
  weights under ZeRO-1/2) overlapped with the last micro-batch's backward (schedule.py);
  stage i's sync may run during the i backward slots of the stages before it. It overlaps
  only where the executor overlaps it (autoplan/execute/data_parallel.py: PyTorch DDP when
  tp = pp = 1 and ZeRO 0, FSDP2 under ZeRO-2/3; an explicit all-reduce after the backward
  otherwise), and never under ``plan.overlap_grad_reduce=False`` (how Megatron-LM ran before its
  2023 ``--overlap-grad-reduce``, NVIDIA/Megatron-LM issue #391 and commit e801b2b), which the
  executor runs with its explicit all-reduce. DDP also broadcasts rank 0's module buffers
  (``broadcast_buffers``, the graph's ``buffer_bytes``) before the forward of each synced
  micro-batch, once a step, on the dp group, exposed; priced as an all-gather of the same bytes
  (a pipelined broadcast moves the whole message over every link, as a ring all-gather does);
- zero_exposed (ZeRO-3 / FSDP): per micro-batch, an all-gather of each block's weights in the
  forward and again in the backward, prefetched one block ahead (schedule.prefetched_exposed_s),
  and the reduce-scatter of its gradients in every micro-batch's backward, so gradients stay
  partitioned (autoplan/execute/trainer.py); in a pipeline, torch's stages accumulate unsharded
  gradients and reduce-scatter once, after the last micro-batch. ZeRO-2 likewise reduce-scatters
  every micro-batch without a pipeline and all-gathers the weights once a step. Every message is
  in the bytes the executor sends: gradients in ``plan.grad_reduce_dtype``, ZeRO-1's all-gather
  in fp32 (the executor's parameters), FSDP2's in the compute dtype (autoplan/cost/volumes.py).
  With ``plan.overlap_param_gather`` (Megatron-LM's ``--overlap-param-gather``, read from its
  config) ZeRO-1/2's weight all-gather runs per block under the next step's first forward,
  prefetched one block ahead as Megatron's forward pre-hooks dispatch it
  (megatron/core/distributed/distributed_data_parallel.py), on each stage, the slowest counted;
- PowerSGD (``plan.grad_compression``, autoplan/cost/dp/compression.py): each block's gradients
  travel as torch's hook sends them, three all-reduces per DDP bucket of the uncompressed
  tensors and the P and Q factors, overlapped like DDP's; the hook's own matmuls and
  error-feedback passes run on the backward's thread and stream, so ``compression_s`` adds
  them to the step whole; under gloo the executor waits for each bucket's hook before the next
  (autoplan/execute/data_parallel.py ``bucket_at_a_time``), so there nothing overlaps;
- expert parallelism: a block's routed experts (1/ep of them per rank) sync over the dp / ep
  ranks holding the same experts, its dense parameters over the dp group
  (autoplan/cost/moe/placement.py); with ZeRO 0 the experts' all-reduce runs after the
  backward, exposed (DDP ignores them; autoplan/execute/expert_parallel.py ``sync_grads``);
- overlap efficiency eta: communication that runs under compute hides only eta of what it could
  (profile ``comm_overlap``, schedule.partially_hidden_s). FSDP2 overlaps through its own CUDA
  streams; on a device without streams (a CPU, gloo) it issues every all-gather and reduce-scatter
  synchronously (``unshard(async_op=False)``, torch/distributed/fsdp/_fully_shard/
  _fsdp_param_group.py), so eta = 0 for ZeRO-2/3 there; DDP's reducer issues async all-reduces,
  which keep the profile's eta;

:class:`DataParallelSync` holds these terms for :class:`autoplan.cost.model.CostModel`; it reads
the model's profile, graph and collective memo.
"""

from __future__ import annotations

from autoplan.cost.compute.roofline import PRECISION_BYTES
from autoplan.cost.dp import compression
from autoplan.cost.memory.per_device import DDP_BUCKET_BYTES
from autoplan.cost.network.comm import bucketed_time_s, collective_time_s
from autoplan.cost.network.mesh import AxisGroup
from autoplan.cost.pp.schedule import overlapped_sync_exposed_s, partially_hidden_s, prefetched_exposed_s
from autoplan.cost.stages import StageTotals
from autoplan.types.cost import Cost
from autoplan.types.plan import Plan


class DataParallelSync:
    """The dp and ZeRO terms of CostModel (module docstring)."""

    def _dp_message_s(self, plan: Plan, kind: str, message_bytes: float, group: AxisGroup) -> float:
        """One dp collective as the executor sends it: in DDP buckets under DDP, else one call per
        FSDP unit or flat buffer (comm.bucketed_time_s)."""
        return self._collective_s(kind, message_bytes, group, DDP_BUCKET_BYTES if plan.runs_ddp else None)

    def _block_sync_s(
        self, plan: Plan, kind: str, block, bytes_per_param: int, group: AxisGroup, *, experts: bool = True
    ) -> float:
        """One block's dp collective: its dense parameters over the dp group, its routed experts'
        (1/ep of them) over the ranks holding the same experts (autoplan/cost/moe/placement.py),
        unless ``experts`` is False."""
        dense = (block.param_count - block.expert_param_count) * bytes_per_param
        expert = block.expert_param_count * bytes_per_param if experts else 0.0
        return self._split_message_s(plan, kind, dense, expert, group)

    def _expert_sync_after_s(self, plan: Plan, stages: list[StageTotals], grad_bytes: int) -> float:
        """Under expert parallelism with DDP or the explicit all-reduce (ZeRO 0), the routed
        experts' gradient all-reduce over edp, which runs after the backward, not under it: DDP
        ignores the expert parameters and ``ExpertParallel.sync_grads`` (autoplan/execute/
        expert_parallel.py) reduces them in one flat buffer once the backward is done; the
        slowest stage's. 0 otherwise (ZeRO-1 steps them in its sharded optimizer, FSDP2 per unit)."""
        if plan.ep == 1 or plan.zero_stage != 0 or plan.dp // plan.ep == 1:
            return 0.0
        edp = self.edp_group(plan)
        return max(self._collective_s("all_reduce", s.expert_params * grad_bytes, edp, None) for s in stages)

    def _split_message_s(
        self, plan: Plan, kind: str, dense_bytes: float, expert_bytes: float, group: AxisGroup
    ) -> float:
        """A dp collective of dense bytes over ``group`` plus, under ep > 1, one of the experts'
        bytes over the edp group (at ep = 1 they travel together)."""
        if plan.ep == 1:
            return self._dp_message_s(plan, kind, dense_bytes + expert_bytes, group)
        edp = self.edp_group(plan)
        return self._dp_message_s(plan, kind, dense_bytes, group) + self._dp_message_s(plan, kind, expert_bytes, edp)

    def _collective_s(self, kind: str, message_bytes: float, group: AxisGroup, bucket_bytes: float | None) -> float:
        """comm.bucketed_time_s, memoised: identical blocks and parameters send identical messages."""
        key = (kind, message_bytes, group, bucket_bytes)
        hit = self._bucket_cache.get(key)
        if hit is None:
            hit = self._bucket_cache[key] = bucketed_time_s(
                self.profile, kind, message_bytes, group=group, bucket_bytes=bucket_bytes
            )
        return hit

    def _dp_time(
        self, cost: Cost, plan: Plan, stages: list[StageTotals], group: AxisGroup, slowest: StageTotals
    ) -> None:
        if plan.dp == 1 or plan.zero_stage >= 3:
            return
        grad_bytes = PRECISION_BYTES[plan.grad_reduce_dtype]
        kind = "all_reduce" if plan.zero_stage == 0 else "reduce_scatter"
        slot_s = slowest.bwd_s + slowest.recompute_s
        exposed, total = 0.0, 0.0
        after = self._expert_sync_after_s(plan, stages, grad_bytes)
        for index, stage in enumerate(stages):
            backward = [b.bwd_s + (b.fwd_s if plan.recompute == "full" else 0.0) for b in reversed(stage.blocks)]
            sync = self._grad_syncs_s(plan, kind, stage, grad_bytes, group, experts=not after)
            total = max(total, sum(sync))
            perfect = max(0.0, overlapped_sync_exposed_s(backward_s=backward, sync_s=sync) - index * slot_s)
            exposed = max(
                exposed,
                partially_hidden_s(exposed_s=perfect, total_s=sum(sync), efficiency=self._overlap_efficiency(plan)),
            )
        if plan.zero_stage == 2 and plan.pp == 1 and plan.num_microbatches > 1:  # reduce-scattered every micro-batch
            earlier = (plan.num_microbatches - 1) * total
            total, exposed = total + earlier, exposed + earlier * (1.0 - self._overlap_efficiency(plan))
        total, exposed = total + after, exposed + after
        gather_s, gather_exposed_s = self._weight_gather_s(plan, stages, group)
        if not self._overlaps_grad_reduce(plan):
            exposed = total
        total, exposed = total + gather_s, exposed + gather_exposed_s
        if plan.runs_ddp and self.graph.buffer_bytes:  # rank 0's buffers, broadcast before a forward: never hidden
            broadcast = collective_time_s(self.profile, "all_gather", self.graph.buffer_bytes, group=group)
            total, exposed = total + broadcast, exposed + broadcast
        cost.dp_comm_s, cost.dp_comm_exposed_s = total, max(0.0, exposed)
        self._compression_time(cost, plan, stages)

    def _weight_gather_s(self, plan: Plan, stages: list[StageTotals], group: AxisGroup) -> tuple[float, float]:
        """ZeRO-1/2's all-gather of the updated weights once a step (ZeRO-1: the executor's fp32
        parameters; ZeRO-2: the compute dtype) and its exposed part: all of it after the step, or
        with ``overlap_param_gather`` per block prefetched under the first forward (module
        docstring). (0, 0) for other stages."""
        if plan.zero_stage not in (1, 2):
            return 0.0, 0.0
        weight = 4 if plan.zero_stage == 1 else PRECISION_BYTES[plan.precision]
        if not plan.overlap_param_gather:
            fullest = max(stages, key=lambda s: s.params)
            gather = self._split_message_s(
                plan, "all_gather", fullest.dense_params * weight, fullest.expert_params * weight, group
            )
            return gather, gather
        eta, total, exposed = self._overlap_efficiency(plan), 0.0, 0.0
        for stage in stages:
            gathers = [self._block_sync_s(plan, "all_gather", b, weight, group) for b in stage.blocks]
            forward = [b.fwd_s for b in stage.blocks]
            total = max(total, sum(gathers))
            exposed = max(exposed, prefetched_exposed_s(compute_s=forward, comm_s=gathers, efficiency=eta))
        return total, exposed

    def _grad_syncs_s(
        self, plan: Plan, kind: str, stage: StageTotals, grad_bytes: int, group: AxisGroup, *, experts: bool = True
    ) -> list:
        """Each block's gradient sync, last block first: as sent (without the routed experts'
        when ``experts`` is False), or PowerSGD's three all-reduces per bucket."""
        if plan.grad_compression != "powersgd":
            return [
                self._block_sync_s(plan, kind, b, grad_bytes, group, experts=experts) for b in reversed(stage.blocks)
            ]
        traffics = self.powersgd_traffics(stage.blocks, plan.powersgd_rank)
        return [compression.sync_s(self.profile, t, group=group, bucket_bytes=DDP_BUCKET_BYTES) for t in traffics[::-1]]

    def powersgd_traffics(self, blocks: list, rank: int) -> list[compression.PowerSGDTraffic]:
        """The blocks' PowerSGD traffic (compression.blocks_traffic), memoised by their parameters."""
        key = ("powersgd", tuple(b.param_names for b in blocks), rank)
        hit = self._bucket_cache.get(key)
        if hit is None:
            hit = self._bucket_cache[key] = compression.blocks_traffic(self.graph, blocks, rank)
        return hit

    def powersgd_stage(self, plan: Plan, stage: StageTotals) -> compression.PowerSGDTraffic:
        """A stage's PowerSGD traffic, all zeros when the plan does not compress (so every term of
        it, sent, computed or held, is 0)."""
        if plan.grad_compression != "powersgd" or plan.dp == 1:
            return compression.PowerSGDTraffic()
        return compression.total(self.powersgd_traffics(stage.blocks, plan.powersgd_rank))

    def _compression_time(self, cost: Cost, plan: Plan, stages: list[StageTotals]) -> None:
        """PowerSGD's own work on the slowest stage's rank (compression.compute_s); 0 without it."""
        if plan.grad_compression == "powersgd" and plan.dp > 1:
            cost.compression_s = max(compression.compute_s(self.profile, self.powersgd_stage(plan, s)) for s in stages)

    def _overlaps_grad_reduce(self, plan: Plan) -> bool:
        """Whether the gradient reduction runs under the backward (module docstring)."""
        if not plan.overlap_grad_reduce:
            return False
        if plan.grad_compression == "powersgd" and self.profile.backend != "nccl":
            return False  # under gloo the executor finishes each bucket's hook before the next
        return plan.zero_stage >= 2 or plan.runs_ddp

    def _overlap_efficiency(self, plan: Plan) -> float:
        """eta of the dp communication (module docstring): 0 for FSDP2 (ZeRO-2/3) without CUDA streams."""
        if plan.zero_stage >= 2 and self.profile.backend != "nccl":
            return 0.0
        return self.profile.comm_overlap.efficiency

    def _zero3_exposed_s(self, plan: Plan, stage: StageTotals, group: AxisGroup) -> float:
        weight_bytes, grad_bytes = PRECISION_BYTES[plan.precision], PRECISION_BYTES[plan.grad_reduce_dtype]
        eta = self._overlap_efficiency(plan)
        gather = [self._block_sync_s(plan, "all_gather", b, weight_bytes, group) for b in stage.blocks]
        scatter = [self._block_sync_s(plan, "reduce_scatter", b, grad_bytes, group) for b in stage.blocks]
        fwd = prefetched_exposed_s(compute_s=[b.fwd_s for b in stage.blocks], comm_s=gather, efficiency=eta)
        bwd_compute = [b.bwd_s for b in reversed(stage.blocks)]
        bwd_gather = prefetched_exposed_s(compute_s=bwd_compute, comm_s=gather[::-1], efficiency=eta)
        bwd_last = prefetched_exposed_s(
            compute_s=bwd_compute, comm_s=[g + s for g, s in zip(gather[::-1], scatter[::-1])], efficiency=eta
        )
        m = plan.num_microbatches
        if plan.pp == 1:  # gradients reduce-scattered every micro-batch (execute/trainer.py)
            return m * fwd + m * bwd_last
        return fwd + (m - 1) * bwd_gather + bwd_last  # pipelining: gathered once, synced on the last
