"""Which messages a plan's data parallelism sends: the one statement (issue 31, item 1).

The time terms (cost/dp/sync.py), the audit's counts (cost/volumes.py) and the search's bounds
(cost/bounds.py) read these messages; none picks a collective, bytes per parameter or repetitions of
its own. For P parameters of one unit, m micro-batches, b_g the bytes of ``grad_reduce_dtype``, b_w
those of the compute dtype, P' = g ceil(P / g) (ZeRO-1's flat buffer padded to the group size g):

| dp mode (execute/data_parallel.py) | grads | weights |
|---|---|---|
| DDP (zero 0, tp = pp = 1, overlapped) | all-reduce P b_g in 25 MiB buckets, last backward | |
| explicit all-reduce (zero 0) | all-reduce P b_g after the backward | |
| ZeRO-1 (execute/zero.py) | reduce-scatter P' b_g after the backward | all-gather P' * 4 (fp32) after the step |
| ZeRO-2 | reduce-scatter P b_g, every backward (pp = 1) or the last (pp > 1) | all-gather P b_w after the step |
| ZeRO-3 | reduce-scatter P b_g, as ZeRO-2 | all-gather P b_w in every forward (the first in a pipeline) and backward |

Under ZeRO-3 with fp8 tensorwise in autoplan's executor on NCCL (types/runtime.py
``fsdp_float8_all_gather``) FP8 linears' weights, P_8 of the P, are gathered in FP8: (P - P_8) b_w + P_8.
With ``schedule_steps`` k, "first" and "last" are each schedule step's (torch's ``perform_reduce_grad``
reduce-scatters and reshards after every step's last backward): k a step. docs/cost-model.md, "Schedule steps".
HSDP (R = ``dp_replicate``, S = dp / R; types/hsdp.py): the table over S ranks, each gradient reduce-scatter
then all-reducing its 1/S shard (P/S b_g; ZeRO-1 P'/S) across the R replicas. Also stated here:
``overlap_param_gather``, PowerSGD's three all-reduces per bucket, top-k's all-gathered pairs, the experts'
edp sync, DDP's buffer broadcast and unused-parameter map, and fp16's overflow flag. docs/cost-model.md,
"Who says what is sent".
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from autoplan.cost.compute.roofline import PRECISION_BYTES
from autoplan.cost.dp.compression import GRAD_BYTES as POWERSGD_GRAD_BYTES
from autoplan.cost.dp.topk import PAIR_BYTES as TOPK_PAIR_BYTES
from autoplan.cost.memory.per_device import DDP_BUCKET_BYTES
from autoplan.types.expert_layout import expert_dp, experts_apart
from autoplan.types.hsdp import dp_shard, shard_view
from autoplan.types.plan import Plan
from autoplan.types.runtime import fsdp_float8_all_gather

GRADS, WEIGHTS = "grads", "weights"
FORWARD, BACKWARD, AFTER_BACKWARD, AFTER_STEP, NEXT_FORWARD = (
    "forward",
    "backward",
    "after_backward",
    "after_step",
    "next_forward",  # the next step's first forward (overlap_param_gather)
)
EACH, FIRST, LAST, ONCE = "each", "first", "last", "once"  # which micro-batches send it
FP32_PARAM_BYTES = 4  # ZeRO-1 gathers the executor's fp32 parameters
FLAG_BYTES = 4  # the fp16 overflow flag, one float
FP8_GATHER_BYTES = 1  # an FP8 weight all-gathered by FSDP2 (torchao's fp8 all-gather)
UNUSED_MAP_BYTES = 4  # one int32 per parameter tensor (DDP find_unused_parameters)


@dataclass(frozen=True)
class DpMessage:
    """One collective each unit of parameters sends (module docstring's table)."""

    payload: str  # GRADS or WEIGHTS
    kind: str  # all_reduce | reduce_scatter | all_gather
    bytes_per_param: int
    phase: str  # FORWARD | BACKWARD | AFTER_BACKWARD | AFTER_STEP | NEXT_FORWARD
    micro_batches: str  # EACH (m times a step) | FIRST | LAST | ONCE (once a step)
    bucketed: bool = False  # in DDP's buckets: how many calls is not fixed by the plan
    padded: bool = False  # ZeRO-1's flat buffer, padded to a multiple of the group size
    apart: bool = False  # the experts' flat all-reduce after the backward, not with each block's
    compressed: bool = False  # PowerSGD's P, Q and uncompressed tensors (cost/dp/compression.py)
    fp8_bytes_per_param: int = 0  # FP8 linears' weights under FSDP2's FP8 all-gather (1), 0 when not
    replicas: bool = False  # HSDP's all-reduce across the dp_replicate group (module docstring)
    share: int = 1  # the message carries 1/share of the unit: HSDP's replica all-reduce of a 1/S shard
    steps: int = 1  # FIRST / LAST in a pipeline: once per schedule step, k = schedule_steps a step (module docstring)

    @property
    def trained_only(self) -> bool:
        """Whether frozen parameters take no part (docs/cost-model.md, "Frozen parameters"): they make
        no gradient, and ZeRO-1's optimizer (its padded buffer) neither steps nor gathers them; FSDP2
        (ZeRO-2/3) shards and gathers every parameter of a unit, frozen or not."""
        return self.payload == GRADS or self.padded

    def sent(self, params: float, frozen: float) -> float:
        """Of ``params`` parameters, ``frozen`` of them frozen, those this message moves."""
        return params - frozen if self.trained_only else params

    def times_per_step(self, num_microbatches: int) -> int:
        """How often an optimizer step sends it: m (EACH), k (:attr:`steps`: FIRST / LAST once per schedule
        step), else once."""
        return num_microbatches if self.micro_batches == EACH else self.steps

    @property
    def bucket_bytes(self) -> float | None:
        """DDP's bucket size, or None: one call per unit (comm.bucketed_time_s)."""
        return DDP_BUCKET_BYTES if self.bucketed else None

    def params_sent(self, params: float, group_size: int) -> float:
        """Parameters in one message of a ``params`` unit: padded to the group for ZeRO-1's buffer."""
        return group_size * math.ceil(params / group_size) if self.padded else params

    def unit_bytes(self, params: float, fp8_params: float = 0.0) -> float:
        """Bytes of one message of ``params`` parameters, ``fp8_params`` of them FP8 linears' weights
        (sent in FP8 when ``fp8_bytes_per_param`` is set: module docstring)."""
        if self.share > 1:  # HSDP's replica all-reduce: gradients only, never FP8
            return params / self.share * self.bytes_per_param
        if not self.fp8_bytes_per_param:
            return params * self.bytes_per_param
        return (params - fp8_params) * self.bytes_per_param + fp8_params * self.fp8_bytes_per_param

    def floor_bytes_per_param(self, precision: str) -> int:
        """The search's bound prices each message at no more than the compute dtype's bytes per
        parameter, min(b, b_w), and fp8 weights at 1 (FSDP2's FP8 all-gather, which the bound does
        not ask about) (cost/bounds.py): never above what the time terms price."""
        fp8_weights = FP8_GATHER_BYTES if precision == "fp8" and self.payload == WEIGHTS else self.bytes_per_param
        return min(self.bytes_per_param, PRECISION_BYTES[precision], fp8_weights)


def dp_messages(plan: Plan, *, backend: str = "") -> tuple[DpMessage, ...]:
    """What each unit of the dense parameters sends over the dp group per step (module docstring);
    ``backend`` (the profile's) says whether ZeRO-3 can gather FP8 weights ('': not asked, as bf16)."""
    if plan.dp == 1:
        return ()
    if plan.sync_every > 1:  # local SGD: the gradients sync within a replica only (cost/dp/local_sgd.py)
        return _synchronous(shard_view(plan), backend=backend) if plan.dp_replicate > 1 else ()
    if plan.dp_replicate > 1:
        return _hsdp(plan, backend=backend)
    return _synchronous(plan, backend=backend)


def _synchronous(plan: Plan, *, backend: str) -> tuple[DpMessage, ...]:
    """dp_messages of a plan without HSDP that syncs every step."""
    if plan.zero_stage == 0:
        return (_zero0_grads(plan),)
    if plan.zero_stage == 3:
        return _zero3(plan, backend=backend)
    if plan.zero_stage == 2:  # FSDP2's gather first, as the audit has always listed them
        return (_updated_weights(plan), _sharded_grads(plan))
    return (_sharded_grads(plan), _updated_weights(plan))


def expert_messages(plan: Plan) -> tuple[DpMessage, ...]:
    """What each unit of the routed experts' parameters sends over the edp group per step: ZeRO-1's
    on a one-rank group too (its second sharded optimizer copies), no FSDP2 or all-reduce there."""
    edp = expert_dp(plan)
    if not experts_apart(plan) or (edp == 1 and plan.zero_stage != 1):
        return ()
    if plan.zero_stage == 0:
        return (DpMessage(GRADS, "all_reduce", _grad_bytes(plan), AFTER_BACKWARD, ONCE, apart=True),)
    return dp_messages(plan)


def _grad_bytes(plan: Plan) -> int:
    return PRECISION_BYTES[plan.grad_reduce_dtype]


def _zero0_grads(plan: Plan) -> DpMessage:
    if plan.grad_compression == "powersgd":
        return DpMessage(GRADS, "all_reduce", POWERSGD_GRAD_BYTES, BACKWARD, LAST, bucketed=True, compressed=True)
    if plan.grad_compression == "topk":  # (index, value) pairs, all-gathered per bucket (cost/dp/topk.py)
        return DpMessage(GRADS, "all_gather", TOPK_PAIR_BYTES, BACKWARD, LAST, bucketed=True, compressed=True)
    if plan.runs_ddp:
        return DpMessage(GRADS, "all_reduce", _grad_bytes(plan), BACKWARD, LAST, bucketed=True)
    return DpMessage(GRADS, "all_reduce", _grad_bytes(plan), AFTER_BACKWARD, ONCE)


def _sharded_grads(plan: Plan) -> DpMessage:
    """ZeRO-1's padded flat buffer after the backward; ZeRO-2/3's per unit in the backward."""
    if plan.zero_stage == 1:
        return DpMessage(GRADS, "reduce_scatter", _grad_bytes(plan), AFTER_BACKWARD, ONCE, padded=True)
    if plan.pp == 1:
        return DpMessage(GRADS, "reduce_scatter", _grad_bytes(plan), BACKWARD, EACH)
    return DpMessage(GRADS, "reduce_scatter", _grad_bytes(plan), BACKWARD, LAST, steps=plan.schedule_steps)


def _updated_weights(plan: Plan) -> DpMessage:
    """ZeRO-1/2's all-gather of the updated weights once a step."""
    zero1 = plan.zero_stage == 1
    weight = FP32_PARAM_BYTES if zero1 else PRECISION_BYTES[plan.precision]
    phase, batches = (NEXT_FORWARD, FIRST) if plan.overlap_param_gather else (AFTER_STEP, ONCE)
    return DpMessage(WEIGHTS, "all_gather", weight, phase, batches, padded=zero1)


def _zero3(plan: Plan, *, backend: str) -> tuple[DpMessage, ...]:
    """FSDP2: gathered in the forward (only the first micro-batch's in a pipeline, which keeps
    them) and again in every backward, FP8 linears' weights in FP8 where torchao's fp8 all-gather
    runs; gradients reduce-scattered as ZeRO-2's."""
    weight = PRECISION_BYTES[plan.precision]
    fp8 = fsdp_float8_all_gather(
        runtime=plan.runtime,
        zero_stage=plan.zero_stage,
        precision=plan.precision,
        recipe=plan.fp8_recipe_used,
        backend=backend,
    )
    gathered = dict(fp8_bytes_per_param=FP8_GATHER_BYTES if fp8 else 0)
    first = dict(micro_batches=FIRST, steps=plan.schedule_steps) if plan.pp > 1 else dict(micro_batches=EACH)
    forward = DpMessage(WEIGHTS, "all_gather", weight, FORWARD, **first, **gathered)
    backward = DpMessage(WEIGHTS, "all_gather", weight, BACKWARD, EACH, **gathered)
    return (forward, backward, _sharded_grads(plan))


def _hsdp(plan: Plan, *, backend: str) -> tuple[DpMessage, ...]:
    """HSDP: the shard group's messages, each gradient reduce-scatter followed by the all-reduce of its
    1/S shard across the replicas, in the same phase and as often (module docstring)."""
    shard = dp_shard(plan)
    out: list[DpMessage] = []
    for message in dp_messages(shard_view(plan), backend=backend):
        out.append(message)
        if message.payload == GRADS:
            out.append(replace(message, kind="all_reduce", replicas=True, share=shard))
    return tuple(out)


def shard_messages(messages: tuple[DpMessage, ...]) -> tuple[DpMessage, ...]:
    """The messages sent over the shard group (all of them without HSDP)."""
    return tuple(m for m in messages if not m.replicas)


def replica_messages(messages: tuple[DpMessage, ...]) -> tuple[DpMessage, ...]:
    """HSDP's all-reduces across the replicate group (none without HSDP)."""
    return tuple(m for m in messages if m.replicas)


def find(messages: tuple[DpMessage, ...], payload: str, phase: str | None = None) -> DpMessage | None:
    """The shard group's message of ``payload`` (in ``phase`` when given), or None."""
    return next((m for m in messages if m.payload == payload and phase in (None, m.phase) and not m.replicas), None)


@dataclass(frozen=True)
class StepMessages:
    """All messages of one kind a rank sends per step on one group, as the audit counts them."""

    kind: str
    count: int | None  # None when DDP's buckets set it
    message_bytes: float


def per_step(
    messages: tuple[DpMessage, ...],
    *,
    params: float,
    units: int,
    group_size: int,
    num_microbatches: int,
    fp8_params: float = 0.0,
    frozen_params: float = 0.0,
    trained_units: int | None = None,
) -> list[StepMessages]:
    """``units`` units holding ``params`` parameters in all (``fp8_params`` of them FP8 linears'
    weights, ``frozen_params`` frozen, in ``trained_units`` of the units, all when None): each kind's
    calls and bytes per step (repetitions summed first, then times the unit's bytes, as the table
    reads); a message that moves trained parameters only (:attr:`DpMessage.trained_only`) skips
    the frozen ones and the units that hold no others."""
    found: dict[tuple, list] = {}
    for message in messages:
        key = (
            message.kind,
            message.bytes_per_param,
            message.fp8_bytes_per_param,
            message.padded,
            message.bucketed,
            message.share,
            message.trained_only,
        )
        found.setdefault(key, [0, message])[0] += message.times_per_step(num_microbatches)
    out = []
    for (kind, _size, _fp8, padded, bucketed, _share, trained), (times, message) in found.items():
        moved = message.sent(params, frozen_params)
        if not moved:
            continue
        sent = group_size * math.ceil(moved / group_size) if padded else moved
        calls = None if bucketed else (trained_units if trained and trained_units is not None else units) * times
        out.append(StepMessages(kind, calls, times * message.unit_bytes(sent, fp8_params)))
    return out


def fsdp_units(blocks: list, synced_params: float, *, experts_apart: bool, trained: bool = False) -> int:
    """FSDP2 units of a stage (execute/data_parallel.py wraps each block, then the stage root):
    the blocks with parameters, and the root when it holds any of the ``synced_params`` (without
    the routed experts' when they sync apart, over edp); with ``trained``, those holding trainable
    parameters (``synced_params`` then the trainable ones): the units that reduce gradients."""

    def held(b) -> float:
        experts = b.expert_param_count - (b.frozen_expert_param_count if trained else 0.0)
        return (b.trainable_param_count if trained else b.param_count) - (experts if experts_apart else 0.0)

    root = synced_params - sum(held(b) for b in blocks)
    holding = sum(1 for b in blocks if (b.trainable_param_count if trained else b.param_count))
    return holding + (1 if root > 0 else 0)


def buffer_broadcast(plan: Plan, buffer_bytes: float, dtypes: int = 1) -> StepMessages | None:
    """DDP broadcasts rank 0's module buffers (``broadcast_buffers``) before the synced
    micro-batch's forward, once a step, on the dp group, one coalesced message per buffer dtype (torch's
    ``_broadcast_coalesced`` flattens tensors of one dtype together: a BatchNorm's fp32 statistics and its int64
    ``num_batches_tracked`` are two); the time terms price it as an all-gather of the same bytes (a pipelined
    broadcast moves the whole message over every link)."""
    if plan.dp == 1 or not plan.runs_ddp or not buffer_bytes:
        return None
    return StepMessages("broadcast", max(1, dtypes), buffer_bytes)


def unused_map(plan: Plan, *, parameter_tensors: int, module_list_experts: bool) -> StepMessages | None:
    """DDP on a model whose experts are a ModuleList looks for parameters a rank did not use
    (``find_unused_parameters``, execute/expert_loop.py) and all-reduces its map of them each step."""
    if plan.dp == 1 or not plan.runs_ddp or not module_list_experts:
        return None
    return StepMessages("all_reduce", None, UNUSED_MAP_BYTES * parameter_tensors)


def overflow_flag(plan: Plan) -> StepMessages | None:
    """fp16's overflow flag, all-reduced on the world group once a step (execute/grad_scaler.py)."""
    return StepMessages("all_reduce", 1, FLAG_BYTES) if plan.precision == "fp16" else None


def sp_partial_syncs(plan: Plan) -> int:
    """How often a step all-reduces the sequence-parallel partial gradients: FSDP2 reduces them
    with each micro-batch's gradients when it syncs every one (no pipeline), finalize_tp_grads
    once a step otherwise (cost/tp/sp_sync.py)."""
    grads = find(dp_messages(plan), GRADS)
    return plan.num_microbatches if grads and plan.zero_stage >= 2 and grads.micro_batches == EACH else 1
