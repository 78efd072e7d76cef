"""What one step of a plan sends, per rank: the volumes the execution audit checks.

Counts and bytes per step on one rank of each pipeline stage, in the convention of
autoplan/cost/network/comm.py (the gathered output of an all-gather, the input of a
reduce-scatter), aggregated into (dim, kind) -> [count, bytes]. Nothing here decides what is
sent: each dimension's messages come from the one statement the time terms price too:

- dp, the experts' edp sync, PowerSGD, DDP's buffer broadcast and unused-parameter map, the fp16
  overflow flag: cost/dp/messages.py (FSDP2 units: each block with parameters and the stage root);
- pipeline sends and receives, and the SP all-gathers at a stage's boundary: cost/pp/messages.py;
- tensor parallelism: each block's messages per micro-batch (cost/tp/splits.py ``block_messages``),
  the outside nodes' on the stage that runs them (the step time charges them to the last stage),
  and under SP one all-reduce per partial-sum parameter (cost/tp/sp_sync.py), as often as
  dp/messages.sp_partial_syncs says;
- expert parallelism: the all-to-alls on the ep group (cost/moe/experts.py ``dispatch_bytes``);
- tied weights across stages: one fp32 all-reduce on the pp link (cost/pp/tied.py);
- compiled blocks: the fused regions the price assumes (cost/compute/fusion.py), once per group of
  identical blocks on the rank, against the kernels inductor generated for their forward;
- context parallelism: each block's attention messages per micro-batch on the cp group
  (cost/cp/messages.py, carried by the block summaries), the forward's again when recomputed; the
  weights' messages and shards over the dp x cp ranks that hold the same weights (cost/cp/weights.py),
  recorded under dim "dp";
- host copies, dim "host": cost/memory/offload.py, cost/memory/activation_offload.py ("act_d2h", "act_h2d").
The fp16 flag is counted under the mesh dim that spans the world when one does.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from autoplan.cost.compute.fusion import region_count
from autoplan.cost.compute.roofline import PRECISION_BYTES
from autoplan.cost.cp import messages as cp_messages
from autoplan.cost.cp.weights import weight_sync_plan
from autoplan.cost.dp import messages as dp_messages
from autoplan.cost.dp import sparse_embedding
from autoplan.cost.dp.local_sgd import outer_message
from autoplan.cost.memory.offload import offload_bytes
from autoplan.cost.model import CostModel
from autoplan.cost.moe.experts import (
    COUNT_BYTES,
    A2AMessages,
    a2a_per_microbatch,
    dispatch_bytes,
    etp_message_bytes,
    reruns_a2a,
)
from autoplan.cost.moe.routed_rows import RoutedRows, add_layer
from autoplan.cost.pp import messages as pp_messages
from autoplan.cost.stages import StageTotals
from autoplan.cost.tp.block import OUTSIDE_PARTS
from autoplan.cost.tp.collectives import Messages
from autoplan.cost.tp.splits import block_messages
from autoplan.types.expert_layout import expert_dp, experts_apart, token_share
from autoplan.types.hsdp import HSDP_AXES, dp_shard, shard_view
from autoplan.types.layout import stage_of_chunk
from autoplan.types.plan import Plan
from autoplan.types.schedules import plan_last_stage, v_shaped

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
    fused_regions: int = 0  # compiled blocks: the fused regions of each distinct block on the rank (one compile each)
    expert_rows: float = 0.0  # rows the rank's experts receive at balanced routing, as the dispatch counts them
    per_expert_row: dict[str, float] = field(default_factory=dict)  # what a row more adds (cost/moe/routed_rows.py)

    def add(self, dim: str, kind: str, count: int | None, message_bytes: float) -> None:
        entry = self.comm.setdefault((dim, kind), [0, 0.0])
        entry[0] = None if count is None or entry[0] is None else entry[0] + count
        entry[1] += message_bytes


def predict(model: CostModel, plan: Plan) -> list[StagePrediction]:
    """Per pipeline stage, what one of its ranks sends, holds and computes in one step."""
    model = model.for_runtime(plan.runtime)  # the graph the plan's runtime runs (CostModel.for_runtime)
    stages, tp_plan, ctx = model.priced_stages(plan)
    weights = weight_sync_plan(plan)
    predictions = []
    for index, stage in enumerate(stages):
        pred = StagePrediction(param_elements=_held_elements(shard_view(weights), stage))
        _tensor_parallel(pred, plan, model, tp_plan, ctx, index)
        _context_parallel(pred, plan, stage, index)
        _data_parallel(pred, weights, stage, index, model)
        _pipeline(pred, plan, index, model)
        _experts(pred, plan, model, stage, index)
        _flops(pred, plan, stage, index)
        _offload(pred, weights, stage)
        _activation_offload(pred, plan, stage)
        pred.fused_regions = _fused_regions(plan, model, index)
        _add(pred, _world_dim(plan), dp_messages.overflow_flag(plan))
        if outer := outer_message(plan, stage):  # local SGD / DiLoCo (cost/dp/local_sgd.py)
            _add(pred, outer[0], outer[1])
        predictions.append(pred)
    _tied(predictions, plan, model, stages)
    return predictions


def _offload(pred: StagePrediction, plan: Plan, stage: StageTotals) -> None:
    """ZeRO-Offload's copies of the rank's slice, dim "host" (cost/memory/offload.py; execute/offload.py
    counts them); FSDP2's (offload "full") run inside its collectives, unrecorded, and are not predicted."""
    if plan.offload != "optimizer":
        return
    down, up = offload_bytes(
        plan, params=stage.params, block_params=0.0, reduce_bytes=PRECISION_BYTES[plan.grad_reduce_dtype]
    )
    pred.add("host", "d2h", 1, down)
    pred.add("host", "h2d", 1, up)


def _activation_offload(pred: StagePrediction, plan: Plan, stage: StageTotals) -> None:
    """Each micro-batch's offloaded activations out and back, dim "host" (cost/memory/activation_offload.py;
    execute/activation_offload.py counts them): bytes only, its count being the storages autograd saves."""
    if plan.offload_activations and stage.offloaded_bytes:
        pred.add("host", "act_d2h", None, plan.num_microbatches * stage.offloaded_bytes)
        pred.add("host", "act_h2d", None, plan.num_microbatches * stage.offloaded_bytes)


def _add(pred: StagePrediction, dim: str, *messages: dp_messages.StepMessages | None) -> None:
    for message in messages:
        if message is not None:
            pred.add(dim, message.kind, message.count, message.message_bytes)


def _world_dim(plan: Plan) -> str:
    return next((dim for dim in ("dp", "tp", "pp") if getattr(plan, dim) == plan.devices), "world")


def _held_elements(plan: Plan, stage: StageTotals) -> float:
    if plan.zero_stage < 2 or plan.dp == 1:
        return stage.params
    if not experts_apart(plan):
        return stage.params / plan.dp
    return stage.dense_params / plan.dp + stage.expert_params / expert_dp(plan)


def _data_parallel(pred: StagePrediction, plan: Plan, stage: StageTotals, index: int, model: CostModel) -> None:
    """The dense parameters' messages over dp (dp_messages.dp_messages), one unit per FSDP2 unit
    (one for DDP's buckets and ZeRO-1's flat buffer; ZeRO-1 overlapping its parameter gather has
    FSDP2's units: execute/param_gather.py); PowerSGD's sent bytes instead of DDP's gradients;
    DDP's buffer broadcast and unused-parameter map."""
    messages = dp_messages.dp_messages(plan, backend=model.profile.backend)
    if not messages:
        return
    apart = experts_apart(plan)
    params = stage.dense_params if apart else stage.params
    frozen = stage.frozen_params - (stage.frozen_expert_params if apart else 0.0)
    tables = _sparse_tables(model, stage)
    frozen += sparse_embedding.sparse_params(tables, tuple(t.name for t in tables))  # out of the dense buckets
    units = trained_units = 1
    if plan.zero_stage >= 2 or plan.overlap_param_gather:  # FSDP2's units; ZeRO-1's per-unit buffers (param_gather.py)
        blocks = _real_blocks(plan, stage, index)
        units = dp_messages.fsdp_units(blocks, params, experts_apart=apart)
        trained_units = dp_messages.fsdp_units(blocks, params - frozen, experts_apart=apart, trained=True)
    grads = dp_messages.find(messages, dp_messages.GRADS)
    if grads.compressed:  # PowerSGD: the uncompressed tensors and the P and Q factors (cost/dp/compression.py)
        pred.add("dp", grads.kind, None, model.powersgd_stage(plan, stage).sent_bytes)
    else:  # HSDP: ZeRO's messages over the shard group ("dp"), the shards' all-reduce across replicas
        fp8, shard = sum(b.fp8_params for b in stage.blocks), dp_shard(plan)
        kept = dict(frozen=frozen, trained_units=trained_units)
        _add(
            pred,
            "dp",
            *_per_step(plan, dp_messages.shard_messages(messages), params, units, shard, fp8_params=fp8, **kept),
        )
        replicas = dp_messages.replica_messages(messages)
        _add(pred, HSDP_AXES[0], *_per_step(plan, replicas, params, units, shard, **kept))
    if tables and plan.dp > 1:  # gloo's sparse all-reduce: indices, then values, all-gathered per table
        pred.add("dp", sparse_embedding.KIND, *sparse_embedding.step_volume(tables, plan))
        pred.add("dp", sparse_embedding.ROWS, len(tables), sparse_embedding.step_rows(tables, plan))
    _add(pred, "dp", dp_messages.buffer_broadcast(plan, model.graph.buffer_bytes, model.graph.buffer_dtypes))
    module_list = any(m.interface == "module_list" for m in model.graph.moe_layers)
    tensors = len(model.graph.parameters)
    _add(pred, "dp", dp_messages.unused_map(plan, parameter_tensors=tensors, module_list_experts=module_list))


def _sparse_tables(model: CostModel, stage: StageTotals) -> tuple:
    """The sparse embedding tables ``stage`` holds (cost/dp/sparse_embedding.py)."""
    held = {name for block in stage.blocks for name in block.param_names}
    return tuple(t for t in model.dp_terms.sparse if t.name in held)


def _per_step(
    plan: Plan,
    messages: tuple,
    params: float,
    units: int,
    group_size: int,
    *,
    fp8_params: float = 0.0,
    frozen: float = 0.0,
    trained_units: int | None = None,
) -> list[dp_messages.StepMessages]:
    return dp_messages.per_step(
        messages,
        params=params,
        units=units,
        group_size=group_size,
        num_microbatches=plan.num_microbatches,
        fp8_params=fp8_params,
        frozen_params=frozen,
        trained_units=trained_units,
    )


def _expert_tp(pred: StagePrediction, plan: Plan, a2a: A2AMessages, rows_bytes: float, num_experts: int) -> None:
    """At expert_tp > 1, beside each all-to-all of the ep group one of the etp group, of ``e`` copies of the
    counts or the ``e`` times larger gathered rows (cost/moe/experts.py ``etp_message_bytes``)."""
    if plan.expert_tp == 1:
        return
    counts, rows = etp_message_bytes(rows_bytes, num_experts=num_experts, etp=plan.expert_tp)
    m = plan.num_microbatches
    pred.add("etp", "all_to_all", round(m * (a2a.counts + a2a.tokens)), m * (a2a.counts * counts + a2a.tokens * rows))


def _experts(pred: StagePrediction, plan: Plan, model: CostModel, stage: StageTotals, index: int) -> None:
    """Expert parallelism: per MoE layer and micro-batch the all-to-alls on the ep group that
    experts.a2a_per_microbatch states, of the rows a rank sends under balanced routing; the rows its
    experts receive and what each row more adds (cost/moe/routed_rows.py: the combine and its gradient, the
    expert GEMMs' FLOPs follow the real routing); and the experts' gradient sync over the edp group
    (dp_messages.expert_messages), one unit per experts module."""
    if not experts_apart(plan):
        return
    names = set(model.stage_layers(plan, index))
    moes = [moe for moe in model.graph.moe_layers if moe.layer in names or (moe.layer is None and plan.pp == 1)]
    f, m = plan.micro_batch_size / model.graph.batch_size, plan.num_microbatches
    rerun, routed = model.layer_reruns(plan, index), RoutedRows()
    for moe in moes:
        again = moe.layer in rerun or (moe.layer is None and plan.recompute != "none")
        a2a = a2a_per_microbatch(recomputed=again and reruns_a2a(plan.recompute), reruns=rerun.get(moe.layer, 1.0))
        kw = dict(precision=plan.precision, batch_fraction=f, tokens=token_share(plan))
        runs = 1 + rerun.get(moe.layer, 1.0) if again else 1.0
        a2a_runs = runs if reruns_a2a(plan.recompute) else 1.0
        placed = dict(ep=plan.ep, expert_tp=plan.expert_tp, microbatches=m)
        add_layer(routed, model.graph, moe, **kw, **placed, runs=runs, a2a_runs=a2a_runs)
        rows = dispatch_bytes(moe, imbalance=1.0, **kw)
        size = a2a.counts * moe.num_experts * COUNT_BYTES + a2a.tokens * rows
        if plan.ep > 1:
            pred.add("ep", "all_to_all", round(m * (a2a.counts + a2a.tokens)), m * size)
        _expert_tp(pred, plan, a2a, rows, moe.num_experts)
    pred.expert_rows, pred.per_expert_row = routed.rows, routed.per_row()
    if stage.expert_params:
        messages = dp_messages.expert_messages(plan)
        units = len(moes) if plan.zero_stage >= 2 else 1
        frozen = stage.frozen_expert_params
        _add(pred, "edp", *_per_step(plan, messages, stage.expert_params, units, expert_dp(plan), frozen=frozen))


def _context_parallel(pred: StagePrediction, plan: Plan, stage: StageTotals, index: int) -> None:
    """Each block's attention messages per micro-batch (cost/cp/messages.py), the forward's again per re-run
    under recomputation (full or selective, as the step time charges them: cost/stages.py)."""
    if plan.cp == 1:
        return
    m = plan.num_microbatches
    for block, rerun in _real_blocks(plan, stage, index, recomputed=True):
        for message in block.cp_messages:
            times = round(m * message.count * (1 + rerun if message.phase == cp_messages.FORWARD else 1))
            for kind in message.audit_kinds():
                pred.add("cp", kind, times, times * message.message_bytes)


def _tensor_parallel(pred: StagePrediction, plan: Plan, model: CostModel, tp_plan: dict, ctx, index: int) -> None:
    """Each block's TP messages per micro-batch (``tensor_parallel.block_messages``), its forward
    ones again per re-run under recomputation (full or selective: collectives are not among the ops
    selective recomputation keeps); the nodes outside every block on the stage that runs them."""
    if plan.tp == 1:
        return
    layers = model.stage_layers(plan, index)
    total, rerun = Messages(), model.layer_reruns(plan, index)
    for layer in layers:
        fwd, bwd = block_messages(model.graph, layer, tp_plan, ctx=ctx)
        total = total + fwd + bwd + (fwd.times(rerun[layer]) if layer in rerun else Messages())  # re-runs them
    outside = [part for part, stage in zip(OUTSIDE_PARTS, (0, plan_last_stage(plan))) if stage == index]
    for part in outside:
        fwd, bwd = block_messages(model.graph, part, tp_plan, ctx=model.part_context(ctx, part))
        total = total + fwd + bwd
    for kind, (count, size) in total.times(plan.num_microbatches).by_kind.items():
        pred.add("tp", kind, round(count), size)
    # FSDP2 reduces the partial gradients with each micro-batch's gradients (it syncs every one
    # without a pipeline); otherwise finalize_tp_grads does, once a step
    syncs = dp_messages.sp_partial_syncs(weight_sync_plan(plan))
    for elements in model.sp_partial_elements(plan, tp_plan, layers + outside):
        pred.add("tp", "all_reduce", syncs, syncs * elements * 4)
    _pipeline_boundary_gathers(pred, plan, model, index)


def _pipeline_boundary_gathers(pred: StagePrediction, plan: Plan, model: CostModel, index: int) -> None:
    """The tp all-gathers of a stage's pipeline boundaries (pp_messages.boundary_gathers)."""
    if plan.pp > 1 and plan.tp > 1:
        _add(pred, "tp", *pp_messages.boundary_gathers(model.chunk_inputs(plan), plan, index))


def _pipeline(pred: StagePrediction, plan: Plan, index: int, model: CostModel) -> None:
    """The stage's sends and receives (pp_messages.stage_sends)."""
    if plan.pp > 1:
        _add(pred, "pp", *pp_messages.stage_sends(model.chunk_inputs(plan), plan, index))


def _real_blocks(plan: Plan, stage: StageTotals, index: int, *, recomputed: bool = False) -> list:
    """The stage's blocks without the outside-node summaries (first on stage 0, last on the last);
    with ``recomputed``, (block, its forward re-runs per micro-batch: 0 where it runs no recompute) pairs."""
    start = 1 if index == 0 else 0
    end = len(stage.blocks) - (1 if index == plan_last_stage(plan) else 0)
    if recomputed:
        return list(zip(stage.blocks[start:end], stage.reruns[start:end]))
    return stage.blocks[start:end]


def _flops(pred: StagePrediction, plan: Plan, stage: StageTotals, index: int) -> None:
    """The tracer's FLOPs of the stage's matmul-class and attention nodes; full recomputation
    re-runs the recomputed blocks' forward inside the backward (every block, or the first k of each
    chunk under a budget: types/recompute.py), as many times as the stage's totals charge (StageTotals.reruns:
    twice where B and W split the backward, cost/pp/reruns.py); selective keeps their outputs."""
    m = plan.num_microbatches
    full = plan.recompute == "full"
    blocks = [(b, r) for b, r in _real_blocks(plan, stage, index, recomputed=True) if r and full]
    pred.forward_flops = m * sum(b.matmul_fwd_flops for b in stage.blocks)
    pred.backward_flops = m * (
        sum(b.matmul_bwd_flops for b in stage.blocks) + sum(r * b.matmul_fwd_flops for b, r in blocks)
    )
    pred.attention_forward_flops = m * sum(b.attention_fwd_flops for b in stage.blocks)
    pred.attention_backward_flops = m * (
        sum(b.attention_bwd_flops for b in stage.blocks) + sum(r * b.attention_fwd_flops for b, r in blocks)
    )


def _fused_regions(plan: Plan, model: CostModel, index: int) -> int:
    """Fused regions (cost/compute/fusion.py) of the rank's compiled blocks, once per group of
    identical blocks: torch.compile compiles a block's code once and reuses it for the blocks
    that pass its guards, so inductor generates each group's kernels once. 0 when nothing compiles."""
    if not (plan.compile or plan.tp_comm_overlap):
        return 0
    graph = model.graph
    chunks = [
        c for i, c in enumerate(plan.stages) if stage_of_chunk(i, pp=plan.pp, v_shape=v_shaped(plan.schedule)) == index
    ] or [graph.layers]
    mine = {fqn for chunk in chunks for fqn in chunk}
    return sum(region_count(graph, [g.layers[0]]) for g in graph.groups if mine.intersection(g.layers))


def _tied(predictions: list[StagePrediction], plan: Plan, model: CostModel, stages: list[StageTotals]) -> None:
    for index, elements in model.tied_elements_by_stage(plan, stages).items():
        predictions[index].add("pp", "all_reduce", 1, elements * 4)
