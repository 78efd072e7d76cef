"""The plans the execution audit runs (tests/dist/test_audit.py checks every case's collectives, parameters, FLOPs
and memory; tests/dist/test_audit_mechanisms.py what particular cases show), the models they run traced, and each
case's priced side: what autoplan/cost/volumes.py predicts from the cost model's stage totals and each stage's priced
peak. tests/dist/conftest.py runs every case once per session (``audits``, ``graphs``), for both files."""

from __future__ import annotations

import dataclasses

import exec_models as m
import exec_tp_plans as tp_plans
from exec_harness import make_plan

from autoplan.cost.model import CostModel
from autoplan.cost.volumes import predict
from autoplan.profile import load_profile
from autoplan.trace import trace

CASES = [
    ("ddp", "gpt", dict(dp=2)),
    ("ddp_bf16_reduce", "gpt", dict(dp=2, precision="bf16", grad_reduce_dtype="bf16")),
    ("zero1", "gpt", dict(dp=2, zero_stage=1)),
    ("zero1_llama_m1", "llama", dict(dp=2, zero_stage=1, num_microbatches=1)),
    ("zero2_accumulate", "gpt", dict(dp=2, zero_stage=2)),
    ("zero2_m1", "llama", dict(dp=2, zero_stage=2, num_microbatches=1)),
    ("zero3_accumulate", "gpt", dict(dp=2, zero_stage=3)),
    ("zero3_bf16", "llama", dict(dp=2, zero_stage=3, precision="bf16", num_microbatches=1)),
    ("pp_gpipe", "gpt", dict(pp=2, schedule="gpipe")),
    ("pp_1f1b", "llama", dict(pp=2, schedule="1f1b", num_microbatches=4)),
    ("pp_interleaved", "gpt", dict(pp=2, schedule="interleaved_1f1b", virtual_stages=2, num_microbatches=4)),
    # zero-bubble (cost/pp/zero_bubble.py): every stage holds min((v-1) m/rounds + p, v m) chunks until their W
    ("pp_interleaved_zb", "gpt", dict(pp=2, schedule="interleaved_zb", virtual_stages=2, num_microbatches=4)),
    # the V schedules (cost/pp/replay.py): the V's turn (chunks 1, 2 on stage 1) sends nothing, the loss is on
    # stage 0, each stage holds the replay's peak of chunks (ZBV 2p, DualPipeV 2p + 1); the embedding tied to the
    # head is two Parameters on stage 0 (one per chunk module), summed there without a pp group
    ("pp_zbv_tied", "gpt_tied", dict(pp=2, schedule="zbv", virtual_stages=2, num_microbatches=4)),
    ("pp_dualpipev", "llama", dict(pp=2, schedule="dualpipev", virtual_stages=2, num_microbatches=4)),
    # full recomputation under a split backward: a block re-runs in B and again in W, once where torch runs its
    # backward whole (chunk 0; DualPipeV's overlapped middle): cost/pp/reruns.py, FLOPs exact
    (
        "pp_interleaved_zb_recompute_full",
        "gpt",
        dict(pp=2, schedule="interleaved_zb", virtual_stages=2, num_microbatches=4, recompute="full"),
    ),
    (
        "pp_dualpipev_recompute_full",
        "llama",
        dict(pp=2, schedule="dualpipev", virtual_stages=2, num_microbatches=4, recompute="full"),
    ),
    # bf16 under autocast (ZeRO-0): the residual stream stays fp32 (fp32 embedding, residual adds promote), so
    # the stages send 4 bytes an element, and the loss keeps fp32 log-probs (cost/compute/dtypes.py)
    ("pp_1f1b_bf16", "llama", dict(pp=2, schedule="1f1b", num_microbatches=4, precision="bf16")),
    ("recompute_full", "gpt", dict(dp=2, recompute="full")),
    ("recompute_selective", "gpt", dict(dp=2, recompute="selective")),
    # budgeted recompute (types/recompute.py): the first k blocks of each chunk, FLOPs and memory as priced
    ("recompute_budget_full", "gpt", dict(dp=2, recompute="full", recompute_blocks=[2])),
    ("pp_recompute_budget_full", "llama", dict(pp=2, schedule="1f1b", recompute="full", recompute_blocks=[1, 0])),
    (
        "tp_sp_recompute_budget_selective",
        "llama",
        dict(tp=2, sequence_parallel=True, recompute="selective", recompute_blocks=[3]),
    ),
    ("dp_fp16", "gpt", dict(dp=2, precision="fp16")),
    ("ddp_fp32_bf16_reduce", "gpt", dict(dp=2, grad_reduce_dtype="bf16")),
    ("zero3_fp32_fp16_reduce", "gpt", dict(dp=2, zero_stage=3, grad_reduce_dtype="fp16")),
    ("ddp_powersgd", "gpt", dict(dp=2, grad_compression="powersgd", powersgd_rank=2)),
    # DiLoCo every 4 steps (cost/dp/local_sgd.py): no gradient sync, the audited step's outer fp32 all-reduce
    ("diloco", "gpt", dict(dp=2, sync_every=4, outer_optimizer="nesterov")),
    # top-k with error feedback: one all-gather of (index, value) pairs per bucket, bytes as priced, the residual held
    ("ddp_topk", "gpt", dict(dp=2, grad_compression="topk", topk_ratio=0.01)),
    ("tp", "gpt", dict(tp=2)),
    ("tp_default_split", "gpt", dict(tp=2, tp_plan={})),
    ("tp_gqa", "llama", dict(tp=2)),
    ("tp_sp", "gpt", dict(tp=2, sequence_parallel=True)),
    # the unbatched [seq, hidden] position embedding rowwise under SP: reduce-scattered on its sequence (dim 0), as
    # priced; on dim 1 (its hidden size) the stream all-gathered it to broadcast, forward and backward (unpriced)
    (
        "tp_sp_wpe_rowwise",
        "gpt",
        dict(tp=2, sequence_parallel=True, tp_plan=tp_plans.gpt_tp_plan(True) | {"wpe": "rowwise"}),
    ),
    ("tp_sp_gqa", "llama", dict(tp=2, sequence_parallel=True)),
    # bf16 autocast under tp + SP: the fp32 stream's norm outputs gathered and their gradients reduce-scattered in
    # fp32, the rowwise linears' outputs in bf16 (cost/tp/collectives.py; priced all in 16 bits before: -33% bytes)
    ("tp_sp_gqa_bf16", "llama", dict(tp=2, sequence_parallel=True, precision="bf16")),
    ("tp_recompute_full", "gpt", dict(tp=2, recompute="full")),
    ("tp_sp_recompute_selective", "llama", dict(tp=2, sequence_parallel=True, recompute="selective")),
    ("zero1_fp32_bf16_reduce", "gpt", dict(dp=2, zero_stage=1, grad_reduce_dtype="bf16")),
    ("zero1_overlap_param_gather", "gpt", dict(dp=2, zero_stage=1, overlap_param_gather=True)),
    ("allreduce_flat_accumulate", "gpt", dict(dp=2, overlap_grad_reduce=False, num_microbatches=4)),
    # an MoE block runs whole on the tokens a tp rank holds: all of them, or its sequence shard
    # under SP with the weights' gradients reduced once a step (execute/expert_sequence.py). Expert
    # parallelism's all-to-all bytes follow the real routing: tests/dist/test_expert_parallel.py
    # audits it by counts
    ("moe_tp", "moe", dict(tp=2)),
    ("moe_tp_sp", "moe", dict(tp=2, sequence_parallel=True)),
    ("moe_tp_sp_recompute_selective", "moe", dict(tp=2, sequence_parallel=True, recompute="selective")),
    # expert_tp = tp = 2 (execute/expert_tp.py): each rank's rows gathered over etp and the partial outputs
    # reduce-scattered, as all-to-alls of e S each, with the counts; the rows never leave the rank's etp pair
    ("moe_tp_sp_etp", "moe", dict(tp=2, sequence_parallel=True, expert_tp=2)),
    # a router biased towards the first ep rank's experts (exec_models.SkewedMoE): the rows each rank's experts
    # received give the measured imbalance, at which the busiest rank's peak is priced
    # (test_the_busiest_ep_rank_peaks_as_priced_at_the_measured_imbalance)
    ("moe_ep_skewed", "moe_skewed", dict(dp=2, ep=2)),
    # context parallelism: K,V all-gathered per attention call (again when recomputed), dK,dV
    # reduce-scattered, gradients synced over dp x cp (execute/context_parallel.py)
    ("cp", "llama", dict(cp=2)),
    ("cp_recompute_full", "gpt", dict(cp=2, recompute="full")),
    ("cp_window_mask", "gpt_window_mask", dict(cp=2)),  # a mask made before the blocks: each rank's rows of it
    # compiled blocks: collectives, FLOPs and memory as priced, and inductor's forward kernels as the fused
    # regions the price assumes (test_compiled_blocks_generate_the_priced_fused_kernels)
    ("ddp_compile", "gpt", dict(dp=2, compile=True)),
    # frozen parameters (a LoRA Llama): no gradient sync, state or weight-gradient FLOPs for them,
    # FSDP2 gathering them with the trainable ones (docs/cost-model.md, "Frozen parameters")
    ("frozen_ddp", "lora", dict(dp=2)),
    ("frozen_zero1", "lora", dict(dp=2, zero_stage=1)),
    ("frozen_zero3", "lora", dict(dp=2, zero_stage=3)),
    ("frozen_pp_1f1b", "lora", dict(pp=2, schedule="1f1b", num_microbatches=4)),
    # ZeRO-Offload: the slice copied down and up as priced (dim "host", execute/offload.py), the master and
    # Adam state off the device's memory
    ("zero1_offload", "gpt", dict(dp=2, zero_stage=1, offload="optimizer")),
    ("zero1_offload_bf16_reduce", "gpt", dict(dp=2, zero_stage=1, offload="optimizer", grad_reduce_dtype="bf16")),
    # activation offload: each block's saved activations but its output out to the host and back, byte for byte
    # (dim "host", execute/activation_offload.py), off the device's peak; beside a recompute budget, and per stage
    ("offload_activations", "gpt", dict(dp=2, offload_activations=True)),
    (
        "zero1_offload_activations_budget",
        "llama",
        dict(dp=2, zero_stage=1, recompute="full", recompute_blocks=[2], offload_activations=True),
    ),
    ("pp_offload_activations", "llama", dict(pp=2, schedule="1f1b", num_microbatches=4, offload_activations=True)),
    # ZeRO-Offload on one dp rank: the whole gradient down and the whole updated vector up, no collective
    ("tp_offload_one_rank", "gpt", dict(tp=2, offload="optimizer")),
    ("pp_offload_one_rank", "llama", dict(pp=2, schedule="1f1b", num_microbatches=4, offload="optimizer")),
]
#: a sparse token embedding (DDP syncs its touched rows): the dense buckets all-reduced as priced, the rows a
#: rank touched (uniform test tokens) within 4 standard deviations of the occupancy estimate U, and its two
#: all-gathers p x those rows (test_sparse_embedding_rows_within_the_estimates_bound)
SPARSE = [("ddp_sparse_embedding", "gpt_sparse", dict(dp=2))]
#: FLOPs and memory as priced, not yet its collectives: LoRA's replicated adapters beside Megatron's splits
#: under SP take their input whole and meet the base's feature shard in a node that runs sharded (DTensor
#: slices the whole side locally, cost/tp/shards.py); the resharding edges into the next linear are still
#: priced per origin (cost/tp/splits.py), not on the layout the sum runs on
FLOPS_ONLY = [("lora_tp_sp", "lora", dict(tp=2, sequence_parallel=True, tp_plan=tp_plans.lora_tp_plan(True)))]
#: a plan whose in-place op cannot run on its DTensor placement (ThirdPartyLlama's q norm does
#: ``var.add_`` on a partial sum under a colwise wq): the executor replicates it first
RESHARDING = [("tp_inplace_reshard", "llama3p", dict(tp=2))]
FOUR = [
    ("dp_tp", "gpt", dict(dp=2, tp=2)),
    ("dp_tp_zero1", "llama", dict(dp=2, tp=2, zero_stage=1)),
    ("dp_tp_zero3_sp", "llama", dict(dp=2, tp=2, zero_stage=3, sequence_parallel=True)),
    ("pp_tp", "llama", dict(pp=2, tp=2)),
    ("pp_tp_sp_1f1b", "gpt", dict(pp=2, tp=2, sequence_parallel=True, schedule="1f1b", num_microbatches=4)),
    # ZeRO-1's per-block weight all-gathers under the next forward, through the pipeline's micro-batches
    ("pp_dp_zero1_overlap_param_gather", "gpt", dict(pp=2, dp=2, zero_stage=1, overlap_param_gather=True)),
    ("pp_dp_zero2", "gpt", dict(pp=2, dp=2, zero_stage=2)),
    ("pp_dp_zero3_gpipe", "llama", dict(pp=2, dp=2, zero_stage=3, schedule="gpipe")),
    ("pp_dp_interleaved", "gpt", dict(pp=2, dp=2, schedule="interleaved_1f1b", virtual_stages=2, num_microbatches=4)),
    # tied weights on two stages under FSDP2, which replaces the parameters the tie sync holds
    ("pp_dp_zero2_tied", "gpt_tied", dict(pp=2, dp=2, zero_stage=2)),
    ("cp_dp_zero3", "llama", dict(cp=2, dp=2, zero_stage=3)),
    ("cp_tp", "gpt", dict(cp=2, tp=2)),
    # expert_tp x ep x edp = 2 x 2 x 1 beside dp x tp = 2 x 2: the ep and etp all-to-alls follow the real routing
    # per rank (ROUTED), their bytes summed over the ranks exact
    ("moe_dp_tp_sp_ep_etp", "moe", dict(dp=2, tp=2, ep=2, expert_tp=2, sequence_parallel=True)),
    # ZeRO-1 beside expert_tp: the experts' edp group holds a dp group's ranks, its messages still dim edp
    ("moe_dp_tp_sp_etp_zero1", "moe", dict(dp=2, tp=2, expert_tp=2, sequence_parallel=True, zero_stage=1)),
    # HSDP, 2 replicas of 2-rank shard groups: ZeRO's messages on the shard group ("dp"), each gradient
    # shard all-reduced across the replicas ("dp_replicate"): FSDP2 on a 2-D mesh, ZeRO-1's sharded optimizer
    ("hsdp_zero1", "gpt", dict(dp=4, dp_replicate=2, zero_stage=1)),
    ("hsdp_zero2", "gpt", dict(dp=4, dp_replicate=2, zero_stage=2)),
    ("hsdp_zero3", "llama", dict(dp=4, dp_replicate=2, zero_stage=3)),
    # DiLoCo across the replicas, FSDP2 within each: ZeRO-2's messages on the shard group only, and the outer
    # all-reduce of each rank's fp32 shard on "dp_replicate"
    ("hsdp_zero2_diloco", "gpt", dict(dp=4, dp_replicate=2, zero_stage=2, sync_every=4, outer_optimizer="nesterov")),
    # HSDP beside cp: the shard group is dp_shard x cp (1 x 2 ranks), the replicas 2 (types/hsdp.py)
    ("hsdp_cp_zero2", "llama", dict(dp=2, dp_replicate=2, cp=2, zero_stage=2)),
    ("hsdp_cp_zero3", "gpt", dict(dp=2, dp_replicate=2, cp=2, zero_stage=3)),
    # cp x pp runs and verifies (test_execute.py) but is not audited: its stages send the rotary tables made
    # before the first block whole, which cost/pp/messages.py prices at 1/cp (docs/cost-model.md, "Context
    # parallelism")
]


#: the models the cases run, by the name a case gives (exec_harness.MODELS)
TRACED = (
    ("gpt", "TinyGPT"),
    ("gpt_tied", "TiedGPT"),
    ("llama", "TinyLlama"),
    ("moe", "TinyMoE"),
    ("moe_skewed", "SkewedMoE"),
    ("llama3p", "ThirdPartyLlama"),
    ("lora", "LoRALlama"),
    ("gpt_sparse", "SparseGPT"),
    ("gpt_window_mask", "WindowMaskedGPT"),
)


class _Graphs(dict):
    """The traced models by name, and each case's priced side once it is asked for (``_priced``): three
    or four tests read each case's prediction, and pricing a plan costs more than reading it."""

    def __init__(self, traced: dict):
        super().__init__(traced)
        self.priced: dict[str, tuple] = {}


def traced_models() -> _Graphs:
    return _Graphs({name: trace(getattr(m, cls)(), (m.tokens(2, 1),)) for name, cls in TRACED})


def priced_profile():
    """cpu-gloo with 8 devices a node: the audited volumes do not depend on the link."""
    return dataclasses.replace(load_profile("cpu-gloo"), devices_per_node=8)


def case(name):
    return next((model, kw) for case, model, kw in CASES + FOUR + RESHARDING + FLOPS_ONLY + SPARSE if case == name)


def priced_case(graphs, name):
    """Case ``name``'s plan, what cost/volumes.py predicts per stage, and each stage's priced peak bytes
    (CostModel's ``stage_memory``), priced once per case."""
    if name not in graphs.priced:
        model, kw = case(name)
        plan = make_plan(model, **kw)
        cost_model = CostModel(graphs[model], priced_profile())
        stages, _tp_plan, _ctx = cost_model.priced_stages(plan)
        peaks = [memory.peak_bytes for memory in cost_model.stage_memory(plan, stages)]
        graphs.priced[name] = (plan, predict(cost_model, plan), peaks)
    return graphs.priced[name]


def predictions(graphs, name):
    plan, predicted, _peaks = priced_case(graphs, name)
    return plan, predicted


def comm_of(rank: dict) -> dict:
    return {(dim, kind): [count, size] for dim, kind, count, size in rank["comm"]}
