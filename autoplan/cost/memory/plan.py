"""A plan's memory per stage: the parts of each stage, the worst peak, and whether it fits.

    peak = max_stage stage_memory(states, activations, in-flight micro-batches, buffers)

with each part's formula and source in cost/memory/per_device.py (a zero-bubble schedule's output
gradients kept from B to W, and the boundary tensors torch's runtime holds to the step's end, join the transient
bytes: cost/pp/zero_bubble.py, cost/memory/replayed.py); a plan is infeasible when the worst stage's peak exceeds the
device's usable memory (``usable_bytes``).
"""

from __future__ import annotations

from dataclasses import replace
from typing import NamedTuple

from autoplan.cost.compute.roofline import PRECISION_BYTES
from autoplan.cost.dp.compression import PowerSGDTraffic
from autoplan.cost.dp.local_sgd import outer_buffer_bytes, with_outer_state
from autoplan.cost.memory.activation_offload import record_activation_offload
from autoplan.cost.memory.in_flight_floor import schedule_key
from autoplan.cost.memory.offload import HOST_BYTES_PER_PARAM, host_shortfall, slice_params
from autoplan.cost.memory.per_device import (
    ModelStates,
    StageMemory,
    comm_buffer_bytes,
    model_states,
    scatter_buffer_bytes,
    stage_memory,
    sync_buffer_bytes,
    usable_bytes,
)
from autoplan.cost.memory.replayed import replays_memory
from autoplan.cost.memory.shared import SharedStageMemo, StageFacts, UnsharedStages
from autoplan.cost.pp.receive_slots import single_chunk_slots
from autoplan.cost.stages import StageTotals
from autoplan.types.cost import Cost
from autoplan.types.expert_layout import expert_dp
from autoplan.types.local_sgd import is_local_sgd, outer_state_bytes_per_param
from autoplan.types.plan import Plan
from autoplan.types.profile import Profile
from autoplan.types.schedules import TORCH_PIPELINES, plan_last_stage


class _PlanFacts(NamedTuple):
    """What every stage's memory reads of the plan alone, taken once per plan (PlanMemory._stages)."""

    reduce_bytes: int  # the gradients' reduce dtype's bytes
    buffer_pp: int  # the pp of the send and receive buffers: 1 where torch's receive slots replace them
    flat: bool  # Plan.flat_grads
    grads_persist: bool  # Plan.runs_ddp or Plan.flat_grads
    single_slots: bool  # torch's 1F1B or GPipe receive slots, priced beside the buffers (_single_chunk_slots)
    outer_state: bool  # DiLoCo's outer optimizer keeps state per parameter (cost/dp/local_sgd.py with_outer_state)
    local_sgd: bool  # an outer sync, with its flat copy after the step (local_sgd.py outer_buffer_bytes)
    schedule: tuple  # what a stage's held counts read of the plan (cost/memory/in_flight_floor.py schedule_key)
    states: dict  # PlanMemory._states by the four parameter counts it reads of a stage: the stages alike share one


class PlanMemory:
    """A plan's memory on one device of ``profile`` (module docstring)."""

    def __init__(self, profile: Profile):
        self.profile = profile
        self._shared = SharedStageMemo()  # what fill reads of the cost model's memoised stages
        self.last_fill: tuple | None = None  # (plan, its stages, the Cost filled): cost/memory/alone.py fill_memory

    def stage_memory(self, plan: Plan, stages: list[StageTotals], powersgd: list[PowerSGDTraffic]) -> list[StageMemory]:
        """Per stage, its memory on one device: the parts and the peak (cost/memory/per_device.py).
        ``powersgd`` is each stage's PowerSGD traffic (cost/dp/compression.py; all zeros when the
        plan does not compress), whose error feedback, factors and hook buffers it holds."""
        return self._stages(plan, stages, powersgd, UnsharedStages())

    def _stages(
        self, plan: Plan, stages: list[StageTotals], powersgd: list[PowerSGDTraffic], facts: StageFacts
    ) -> list[StageMemory]:
        whole = _PlanFacts(
            reduce_bytes=PRECISION_BYTES[plan.grad_reduce_dtype],
            buffer_pp=1 if torch_slots(plan) else plan.pp,  # torch's receive slots instead, below or in the replay
            flat=plan.flat_grads,
            grads_persist=plan.runs_ddp or plan.flat_grads,  # DDP's buckets, the flat buffer
            single_slots=torch_slots(plan) and not replays_memory(plan),
            outer_state=bool(outer_state_bytes_per_param(plan)),
            local_sgd=is_local_sgd(plan),
            schedule=schedule_key(plan),
            states={},
        )
        return [
            self._stage_memory(plan, index, stage, held, facts, whole)
            for index, (stage, held) in enumerate(zip(stages, powersgd))
        ]

    def _stage_memory(
        self,
        plan: Plan,
        index: int,
        stage: StageTotals,
        powersgd: PowerSGDTraffic,
        facts: StageFacts,
        whole: _PlanFacts,
    ) -> StageMemory:
        reduce_bytes = whole.reduce_bytes
        last_block_bytes, block_params, block_trainable = facts.blocks(stage)
        in_flight, in_flight_after, pending, sent, transient = facts.held(plan, index, stage, whole.schedule)
        counts = (stage.dense_params, stage.trainable_dense_params, stage.expert_params, stage.trainable_expert_params)
        if (states := whole.states.get(counts)) is None:
            states = whole.states[counts] = self._states(plan, stage)
        return stage_memory(
            states=with_outer_state(states, plan, stage) if whole.outer_state else states,  # DiLoCo's, if any
            saved_bytes=stage.saved_bytes,
            transient_bytes=transient + pending * stage.wgrad_held_bytes + sent,
            in_flight=in_flight,
            in_flight_after=in_flight_after,
            last_block_bytes=last_block_bytes,
            buffers_bytes=comm_buffer_bytes(
                zero_stage=plan.zero_stage,
                dp=plan.dp,
                pp=whole.buffer_pp,
                boundary_bytes=stage.held_boundary_bytes[0],  # its larger boundary: stage 0's output, the last's input
                block_params=block_params,
                precision=plan.precision,
            )
            + (_single_chunk_slots(plan, index, stage) if whole.single_slots else 0.0)
            + powersgd.held_bytes,  # error feedback and P, Q (cost/dp/compression.py)
            scatter_bytes=scatter_buffer_bytes(
                zero_stage=plan.zero_stage,
                dp=plan.dp,
                pp=plan.pp,
                block_params=block_trainable,  # the reduce-scatter moves trained gradients only
                precision=plan.precision,
                reduce_bytes=reduce_bytes,
            ),
            sync_bytes=sync_buffer_bytes(
                params=stage.trainable_params,
                zero_stage=plan.zero_stage,
                dp=plan.dp,
                tp=plan.tp,
                pp=plan.pp,
                reduce_bytes=reduce_bytes,
                unit_params=_largest_unit(plan, stage, index) if plan.overlap_param_gather else 0.0,
                flat=whole.flat,
                staged=self.profile.backend == "gloo",
            )
            + powersgd.hook_bytes  # with the last bucket, after the backward (M3)
            + (outer_buffer_bytes(plan, stage) if whole.local_sgd else 0.0),  # local SGD's flat copy, after the step
            grads_persist=whole.grads_persist,
        )

    def _states(self, plan: Plan, stage: StageTotals) -> ModelStates:
        """Weights, gradients and optimizer state: dense parameters sharded over dp, the routed
        experts' (1/ep of them) over the dp / ep ranks that hold the same experts. It reads four counts of
        ``stage``: its dense and expert parameters and the trained ones of each (_PlanFacts.states' key)."""
        dense = model_states(
            params=stage.dense_params,
            precision=plan.precision,
            zero_stage=plan.zero_stage,
            dp=plan.dp,
            pp=plan.pp,
            trainable=stage.trainable_dense_params,
            offload=plan.offload,
        )
        if not stage.expert_params:
            return dense
        experts = expert_states(plan, params=stage.expert_params, trainable=stage.trainable_expert_params)
        return ModelStates(
            weights_bytes=dense.weights_bytes + experts.weights_bytes,
            grads_bytes=dense.grads_bytes + experts.grads_bytes,
            optimizer_bytes=dense.optimizer_bytes + experts.optimizer_bytes,
        )

    def fill(
        self,
        cost: Cost,
        plan: Plan,
        stages: list[StageTotals],
        powersgd: list[PowerSGDTraffic],
        schedule_steps: int = 1,
    ) -> None:
        """Write the worst stage's memory parts and peak into ``cost``, and mark it infeasible when
        the peak exceeds the usable memory. ``stages``: the cost model's memoised totals, never edited
        (CostModel._stages), whose schedule's holding and block facts are memoised (cost/memory/shared.py).
        ``plan``: one schedule step's, run ``schedule_steps`` times an optimizer step (types/schedule_steps.py)."""
        worst = max(self._stages(plan, stages, powersgd, self._shared), key=lambda m: m.peak_bytes)
        cost.weights_bytes, cost.grads_bytes, cost.optimizer_bytes = (
            int(worst.weights_bytes),
            int(worst.grads_bytes),
            int(worst.optimizer_bytes),
        )
        cost.activations_bytes, cost.comm_buffer_bytes = int(worst.activations_bytes), int(worst.buffers_bytes)
        cost.peak_memory_bytes = int(worst.peak_bytes)
        cost.memory_capacity_bytes = int(self.profile.device.memory_bytes)
        limit = usable_bytes(self.profile.device.memory_bytes)
        if plan.offload != "none":  # the host holds the offloaded states (cost/memory/offload.py)
            host_bytes = HOST_BYTES_PER_PARAM * slice_params(plan, max(s.params for s in stages))
            cost.extra["host_bytes"] = host_bytes
            if shortfall := host_shortfall(self.profile, plan, host_bytes):
                cost.feasible, cost.reason = False, shortfall
        record_activation_offload(cost, self.profile, plan, stages, schedule_steps=schedule_steps)  # host, if any
        if cost.peak_memory_bytes > limit:
            cost.feasible = False
            cost.reason = (
                f"needs {cost.peak_memory_bytes / 2**30:.1f} GiB per device but {limit / 2**30:.1f} GiB is usable "
                f"({self.profile.device.memory_bytes / 2**30:.0f} GiB less allocator headroom)"
            )


def torch_slots(plan: Plan) -> bool:
    """Whether torch's ``PipelineStage`` runs ``plan``'s pipeline, with its receive slots (cost/pp/receive_slots.py)
    in place of one send and one receive buffer: where its runtime runs torch's classes, and every V."""
    return plan.pp > 1 and (plan.runtime in TORCH_PIPELINES or replays_memory(plan))


def _single_chunk_slots(plan: Plan, index: int, stage: StageTotals) -> float:
    """The bytes of the receive slots of a torch-run 1F1B or GPipe stage, a forward one for its input (D_in) and a
    gradient one for its output's gradient (D_g,out: cost/pp/receive_slots.py); the replayed schedules count theirs
    in their states (cost/memory/replayed.py)."""
    if not torch_slots(plan) or replays_memory(plan):
        return 0.0
    forward, grads = single_chunk_slots(pp=plan.pp, m=plan.num_microbatches, rank=index)
    return forward * stage.boundary_bytes + grads * stage.output_grad_bytes


def _largest_unit(plan: Plan, stage: StageTotals, index: int) -> float:
    """The most trainable parameters one ZeRO-1 unit of the stage holds (execute/param_gather.py): a
    block, or all outside them (the summaries of the nodes before the first block, on stage 0, and
    after the last, on the last stage, are one unit with them)."""
    start, end = (1 if index == 0 else 0), len(stage.blocks) - (1 if index == plan_last_stage(plan) else 0)
    blocks = [b.trainable_param_count for b in stage.blocks[start:end]]
    return max(blocks + [stage.trainable_params - sum(blocks)])


def expert_states(plan: Plan, *, params: float, trainable: float) -> ModelStates:
    """The routed experts' model states of ``params`` expert parameters on one device (``trainable`` of them
    trained), sharded over the edp ranks that hold the same experts and never offloaded; linear in both counts
    (the search's memory floors sum them over the stages: cost/bounds.py)."""
    edp = expert_dp(plan)
    experts = model_states(
        params=params, precision=plan.precision, zero_stage=plan.zero_stage, dp=edp, pp=plan.pp, trainable=trainable
    )
    if plan.zero_stage == 1 and plan.dp > 1 and edp == 1:  # ZeRO-1 steps the experts in a sharded
        # optimizer of one rank (execute/zero.py sharded_optimizer): its fp32 master is a whole copy
        experts = replace(experts, optimizer_bytes=12 * trainable)
    return experts
