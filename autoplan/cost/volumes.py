"""What one step of a plan sends, per rank: the volumes the execution audit checks.

The time terms of autoplan/cost/model.py are built from these messages; this module states
them as counts and bytes per step on one rank of each pipeline stage, in the convention of
autoplan/cost/network/comm.py (the gathered output of an all-gather, the input of a reduce-scatter).
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

DDP on a model with ModuleList MoE layers also all-reduces its map of unused parameters, 4 bytes
per parameter tensor (``_unused_map``).

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
spans the world when one does. Expert parallelism: the all-to-alls on the ep group and the
experts' gradient sync on the edp group (``_experts``); dense parameters as above.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from autoplan.cost.compute.roofline import PRECISION_BYTES
from autoplan.cost.model import CostModel
from autoplan.cost.moe.experts import COUNT_BYTES, dispatch_bytes
from autoplan.cost.stages import StageTotals
from autoplan.cost.tp.block import OUTSIDE_PARTS
from autoplan.cost.tp.splits import Messages, block_messages
from autoplan.types.layout import chunks_of_stage
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
        _compressed(pred, plan, stage, model)
        _unused_map(pred, plan, model)
        _pipeline(pred, plan, index, model)
        _experts(pred, plan, model, stage, index)
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
    if plan.zero_stage < 2 or plan.dp == 1:
        return stage.params
    if plan.ep == 1:
        return stage.params / plan.dp
    return stage.dense_params / plan.dp + stage.expert_params / (plan.dp // plan.ep)


def _data_parallel(pred: StagePrediction, plan: Plan, stage: StageTotals, index: int, buffer_bytes: int) -> None:
    if plan.dp == 1:
        return
    p = _dense(plan, stage)
    grad = PRECISION_BYTES[plan.grad_reduce_dtype]
    if plan.zero_stage == 0:
        ddp = plan.runs_ddp
        pred.add("dp", "all_reduce", None if ddp else 1, p * grad)
        if ddp and buffer_bytes:  # DDP broadcasts rank 0's buffers before the synced micro-batch's forward
            pred.add("dp", "broadcast", 1, buffer_bytes)
    elif plan.zero_stage == 1:
        padded = plan.dp * math.ceil(p / plan.dp)
        pred.add("dp", "reduce_scatter", 1, padded * grad)
        pred.add("dp", "all_gather", 1, padded * 4)
    else:
        _fsdp(pred, plan, stage, grad, index)


def _compressed(pred: StagePrediction, plan: Plan, stage: StageTotals, model: CostModel) -> None:
    """PowerSGD sends the uncompressed tensors and the P and Q factors instead of every gradient
    (autoplan/cost/dp/compression.py): replace the DDP all-reduce bytes with those."""
    if plan.grad_compression != "powersgd" or plan.dp == 1:
        return
    traffic = model.powersgd_stage(plan, stage)
    pred.comm[("dp", "all_reduce")] = [None, traffic.sent_bytes]


def _unused_map(pred: StagePrediction, plan: Plan, model: CostModel) -> None:
    """DDP on a model with MoE layers whose experts are a ModuleList looks for parameters a rank
    did not use (``find_unused_parameters``, autoplan/execute/expert_loop.py): each step it
    all-reduces its map of them, one int32 per parameter tensor."""
    if plan.runs_ddp and any(m.interface == "module_list" for m in model.graph.moe_layers):
        pred.add("dp", "all_reduce", None, 4 * len(model.graph.parameters))


def _dense(plan: Plan, stage: StageTotals) -> float:
    """The parameters synced over dp: all of them, or all but the experts' under ep > 1."""
    return stage.dense_params if plan.ep > 1 else stage.params


def _fsdp(pred: StagePrediction, plan: Plan, stage: StageTotals, grad: int, index: int) -> None:
    p = _dense(plan, stage)
    blocks = _real_blocks(plan, stage, index)
    experts = plan.ep > 1
    root = p - sum(b.param_count - (b.expert_param_count if experts else 0.0) for b in blocks)  # the stage's own
    units = sum(1 for b in blocks if b.param_count) + (1 if root > 0 else 0)
    _fsdp_units(pred, plan, "dp", units, p, grad)


def _fsdp_units(pred: StagePrediction, plan: Plan, dim: str, units: int, p: float, grad: int) -> None:
    """``units`` FSDP2 units of ``p`` parameters in all, on the ``dim`` group (module docstring)."""
    m, weight = plan.num_microbatches, PRECISION_BYTES[plan.precision]
    if plan.pp == 1:
        gathers = 1 if plan.zero_stage == 2 else 2 * m
        scatters = m
    else:
        gathers = 1 if plan.zero_stage == 2 else m + 1
        scatters = 1
    pred.add(dim, "all_gather", units * gathers, gathers * p * weight)
    pred.add(dim, "reduce_scatter", units * scatters, scatters * p * grad)


def _experts(pred: StagePrediction, plan: Plan, model: CostModel, stage: StageTotals, index: int) -> None:
    """Expert parallelism: per MoE layer and micro-batch five all-to-alls on the ep group (the
    per-expert counts, dispatch and combine, and the gradients of the last two), three more when
    recomputation re-runs the forward, of the rows a rank sends under balanced routing (the
    measured bytes of the combine and its gradient follow the real routing); and the experts'
    gradient sync over the edp group."""
    if plan.ep == 1:
        return
    names = set(model.stage_layers(plan, index))
    moes = [moe for moe in model.graph.moe_layers if moe.layer in names or (moe.layer is None and plan.pp == 1)]
    f, m = plan.micro_batch_size / model.graph.batch_size, plan.num_microbatches
    counts, tokens = (2, 6) if plan.recompute != "none" else (1, 4)
    for moe in moes:
        rows = dispatch_bytes(moe, precision=plan.precision, batch_fraction=f, imbalance=1.0)
        pred.add(
            "ep", "all_to_all", m * (counts + tokens), m * (counts * moe.num_experts * COUNT_BYTES + tokens * rows)
        )
    _expert_sync(pred, plan, stage.expert_params, units=len(moes))


def _expert_sync(pred: StagePrediction, plan: Plan, elements: float, *, units: int) -> None:
    """The experts' gradients over edp (autoplan/execute/expert_parallel.py): one all-reduce with
    DDP or the explicit all-reduce (none when no other rank holds the experts), ZeRO-1's second
    sharded optimizer (a one-rank group's copies too), or one FSDP2 unit per experts module."""
    edp, grad = plan.dp // plan.ep, PRECISION_BYTES[plan.grad_reduce_dtype]
    if not elements:
        return
    if plan.zero_stage == 0:
        if edp > 1:
            pred.add("edp", "all_reduce", 1, elements * grad)
    elif plan.zero_stage == 1:
        padded = edp * math.ceil(elements / edp)
        pred.add("edp", "reduce_scatter", 1, padded * grad)
        pred.add("edp", "all_gather", 1, padded * 4)
    elif edp > 1:  # FSDP2 on a one-rank mesh issues no collective
        _fsdp_units(pred, plan, "edp", units, elements, grad)


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
    for c in chunks_of_stage(index, pp=plan.pp, virtual_stages=plan.virtual_stages):
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
    for c in chunks_of_stage(index, pp=plan.pp, virtual_stages=plan.virtual_stages):
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
