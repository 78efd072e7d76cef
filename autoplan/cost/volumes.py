"""What one step of a plan sends, per rank: the volumes the execution audit checks.

The time terms of autoplan/cost/model.py are built from these messages; this module states
them as counts and bytes per step on one rank of each pipeline stage, in the convention of
autoplan/cost/comm.py (the gathered output of an all-gather, the input of a reduce-scatter).
P is the stage's local parameter elements (after TP), m the micro-batches, U the FSDP units
of the stage (its blocks and the stage root), b_g the bytes of ``plan.grad_reduce_dtype``.

| dp mode (execute/data_parallel.py) | per step |
|---|---|
| DDP (zero 0, tp = pp = 1) | all-reduce of P b_g bytes (DDP's buckets: count not fixed by the plan) |
| explicit all-reduce (zero 0) | one all-reduce of P b_g |
| ZeRO-1 | one reduce-scatter of P' b_g and one all-gather of P' * 4 (fp32 parameters), P' = dp ceil(P/dp) |
| ZeRO-2, pp = 1 | U all-gathers of P b_w once; U m reduce-scatters of P b_g (every micro-batch) |
| ZeRO-3, pp = 1 | 2 U m all-gathers of P b_w (forward and backward); U m reduce-scatters |
| ZeRO-2/3, pp > 1 | see below |

ZeRO-2/3, pp > 1: torch.distributed.pipelining's FSDP handling: gradients accumulate
unsharded and are reduce-scattered once (U); ZeRO-2 gathers once (U); ZeRO-3 gathers in the
first forward and in every backward (U (m + 1)).

b_w is the compute dtype under FSDP2's parameter cast, else 4. Pipeline: each chunk but the
last sends its output to the next chunk once per micro-batch, and each chunk but the first
sends the gradient of its input back, both of the boundary activation, whole on every tp
rank (the executor gathers DTensor outputs at a stage's exit); one message per tensor, and
gradients only of those that need one (rotary tables and masks travel forward only).
Tensor parallelism: each block's messages per micro-batch from the same terms the cost model prices
(``tensor_parallel.block_messages``), and under sequence parallelism one all-reduce a step
per parameter whose gradient is a partial sum (``sp_sync.sp_partial_params``); the
nodes outside every block on the stage that runs them (before the first block: stage 0; the
rest: the last stage). The step time charges them all to the last stage (model.py): the same
messages, attributed to one stage. Tied weights across stages:
one all-reduce of their gradient on the pp link. fp16: one 4-byte all-reduce of the
overflow flag on the world group (execute/grad_scaler.py), counted under the mesh dim that
spans the world when one does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from autoplan.cost.compute import PRECISION_BYTES
from autoplan.cost.memory import runs_ddp
from autoplan.cost.model import CostModel
from autoplan.cost.stages import StageTotals
from autoplan.cost.tensor_parallel import Messages, block_messages
from autoplan.cost.tp_block import OUTSIDE_PARTS
from autoplan.types.plan import Plan

#: (dim, kind) -> [count or None when the plan does not fix it, bytes]
Volumes = dict[tuple[str, str], list]


@dataclass
class StagePrediction:
    """One rank of one pipeline stage, per step."""

    comm: Volumes = field(default_factory=dict)
    param_elements: float = 0.0
    forward_flops: float = 0.0  # linears, matmuls, convolutions
    backward_flops: float = 0.0  # the same, recomputed forwards included
    attention_forward_flops: float = 0.0
    attention_backward_flops: float = 0.0

    def add(self, dim: str, kind: str, count: int | None, message_bytes: float) -> None:
        entry = self.comm.setdefault((dim, kind), [0, 0.0])
        entry[0] = None if count is None or entry[0] is None else entry[0] + count
        entry[1] += message_bytes


def predict(model: CostModel, plan: Plan) -> list[StagePrediction]:
    """Per pipeline stage, what one of its ranks sends, holds and computes in one step."""
    stages, tp_plan, ctx = model.priced_stages(plan)
    predictions = []
    for index, stage in enumerate(stages):
        pred = StagePrediction(param_elements=_held_elements(plan, stage))
        _tensor_parallel(pred, plan, model, tp_plan, ctx, index)
        _data_parallel(pred, plan, stage, index, model.graph.buffer_bytes)
        _pipeline(pred, plan, index, model)
        _flops(pred, plan, stage, index)
        if (
            plan.precision == "fp16"
        ):  # the overflow flag, on the world group (a mesh dim's group when it spans the world)
            pred.add(_world_dim(plan), "all_reduce", 1, 4)
        predictions.append(pred)
    _tied(predictions, plan, model, stages)
    return predictions


def _world_dim(plan: Plan) -> str:
    return next((dim for dim in ("dp", "tp", "pp") if getattr(plan, dim) == plan.devices), "world")


def _held_elements(plan: Plan, stage: StageTotals) -> float:
    return stage.params / plan.dp if plan.zero_stage >= 2 and plan.dp > 1 else stage.params


def _data_parallel(pred: StagePrediction, plan: Plan, stage: StageTotals, index: int, buffer_bytes: int) -> None:
    if plan.dp == 1:
        return
    p = stage.params
    grad = PRECISION_BYTES[plan.grad_reduce_dtype]
    if plan.zero_stage == 0:
        ddp = runs_ddp(plan)
        pred.add("dp", "all_reduce", None if ddp else 1, p * grad)
        if ddp and buffer_bytes:  # DDP broadcasts rank 0's buffers before the synced micro-batch's forward
            pred.add("dp", "broadcast", 1, buffer_bytes)
    elif plan.zero_stage == 1:
        padded = plan.dp * math.ceil(p / plan.dp)
        pred.add("dp", "reduce_scatter", 1, padded * grad)
        pred.add("dp", "all_gather", 1, padded * 4)
    else:
        _fsdp(pred, plan, stage, grad, index)


def _fsdp(pred: StagePrediction, plan: Plan, stage: StageTotals, grad: int, index: int) -> None:
    p, m = stage.params, plan.num_microbatches
    weight = PRECISION_BYTES[plan.precision]
    blocks = _real_blocks(plan, stage, index)
    root = stage.params - sum(b.param_count for b in blocks)  # the stage module's own (outside-node) weights
    units = sum(1 for b in blocks if b.param_count) + (1 if root > 0 else 0)
    if plan.pp == 1:
        gathers = 1 if plan.zero_stage == 2 else 2 * m
        scatters = m
    else:
        gathers = 1 if plan.zero_stage == 2 else m + 1
        scatters = 1
    pred.add("dp", "all_gather", units * gathers, gathers * p * weight)
    pred.add("dp", "reduce_scatter", units * scatters, scatters * p * grad)


def _tensor_parallel(pred: StagePrediction, plan: Plan, model: CostModel, tp_plan: dict, ctx, index: int) -> None:
    """Each block's TP messages per micro-batch (``tensor_parallel.block_messages``), its forward
    ones twice under recomputation (full or selective: collectives are not among the ops
    selective recomputation keeps); the nodes outside every block on the stage that runs them."""
    if plan.tp == 1:
        return
    layers = model.stage_layers(plan, index)
    total = Messages()
    for layer in layers:
        fwd, bwd = block_messages(model.graph, layer, tp_plan, ctx=ctx)
        total = total + fwd + bwd + (fwd if plan.recompute != "none" else Messages())  # recomputation re-runs them
    outside = [part for part, stage in zip(OUTSIDE_PARTS, (0, plan.pp - 1)) if stage == index]
    for part in outside:
        fwd, bwd = block_messages(model.graph, part, tp_plan, ctx=ctx)
        total = total + fwd + bwd
    for kind, (count, size) in total.times(plan.num_microbatches).by_kind.items():
        pred.add("tp", kind, count, size)
    # FSDP2 reduces the partial gradients with each micro-batch's gradients (it syncs every one
    # without a pipeline); otherwise finalize_tp_grads does, once a step
    syncs = plan.num_microbatches if plan.zero_stage >= 2 and plan.dp > 1 and plan.pp == 1 else 1
    for elements in model.sp_partial_elements(plan, tp_plan, layers + outside):
        pred.add("tp", "all_reduce", syncs, syncs * elements * 4)
    _sequence_parallel_boundaries(pred, plan, model, index)


def _sequence_parallel_boundaries(pred: StagePrediction, plan: Plan, model: CostModel, index: int) -> None:
    """Under SP a stage gathers its sequence-sharded output before sending it, and gathers the
    gradient of its input before sending that back: one tp all-gather of the boundary each."""
    if plan.pp == 1 or not plan.sequence_parallel:
        return
    chunks = model.chunk_inputs(plan)
    m = plan.num_microbatches
    for c in range(index, len(chunks), plan.pp):
        sent = [chunks[c + 1][0]] if c < len(chunks) - 1 else []  # the activations leaving the chunk
        returned = [chunks[c][1]] if c > 0 else []  # the input gradients going back
        for sizes in sent + returned:
            big = [b for b in sizes if b > 0]
            pred.add("tp", "all_gather", m * len(big[:1]), m * max(big, default=0.0))


def _pipeline(pred: StagePrediction, plan: Plan, index: int, model: CostModel) -> None:
    if plan.pp == 1:
        return
    chunks = model.chunk_inputs(plan)
    last = len(chunks) - 1
    m = plan.num_microbatches
    for c in range(index, len(chunks), plan.pp):
        if c < last:  # what the next chunk receives, and the gradients of those that need one back
            forward, backward = chunks[c + 1]
            pred.add("pp", "send", m * len(forward), m * sum(forward))
            pred.add("pp", "recv", m * len(backward), m * sum(backward))
        if c > 0:
            forward, backward = chunks[c]
            pred.add("pp", "recv", m * len(forward), m * sum(forward))
            pred.add("pp", "send", m * len(backward), m * sum(backward))


def _real_blocks(plan: Plan, stage: StageTotals, index: int) -> list:
    """The stage's blocks without the outside-node summaries (first on stage 0, last on the last)."""
    start = 1 if index == 0 else 0
    end = len(stage.blocks) - (1 if index == plan.pp - 1 else 0)
    return stage.blocks[start:end]


def _flops(pred: StagePrediction, plan: Plan, stage: StageTotals, index: int) -> None:
    """The tracer's FLOPs of the stage's matmul-class and attention nodes; full recomputation
    re-runs the blocks' forward inside the backward (selective keeps their outputs)."""
    m = plan.num_microbatches
    blocks = _real_blocks(plan, stage, index)
    rerun = plan.recompute == "full"
    pred.forward_flops = m * sum(b.matmul_fwd_flops for b in stage.blocks)
    pred.backward_flops = m * (
        sum(b.matmul_bwd_flops for b in stage.blocks) + (sum(b.matmul_fwd_flops for b in blocks) if rerun else 0.0)
    )
    pred.attention_forward_flops = m * sum(b.attention_fwd_flops for b in stage.blocks)
    pred.attention_backward_flops = m * (
        sum(b.attention_bwd_flops for b in stage.blocks)
        + (sum(b.attention_fwd_flops for b in blocks) if rerun else 0.0)
    )


def _tied(predictions: list[StagePrediction], plan: Plan, model: CostModel, stages: list[StageTotals]) -> None:
    for index, elements in model.tied_elements_by_stage(plan, stages).items():
        predictions[index].add("pp", "all_reduce", 1, elements * 4)
