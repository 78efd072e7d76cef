"""The execution audit: on real gloo groups, the collectives each rank issues in one step equal,
count for count and byte for byte, what autoplan/cost/volumes.py predicts from the cost model's
own stage totals; parameters held per rank match the plan's shards; and recomputation really
re-runs the forward matmuls it is priced for; and each rank's peak of live tensor bytes is within 10% of
the priced peak (docs/cost-model.md, "The execution audit")."""

from __future__ import annotations

import csv
import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import exec_models as m
import pytest
from exec_harness import make_plan, run_audits

from autoplan.cost.dp.compression import traffic_of
from autoplan.cost.dp.sparse_embedding import INDEX_BYTES, distinct_rows_sd, reads_per_rank, sparse_tables
from autoplan.cost.model import CostModel
from autoplan.cost.volumes import predict
from autoplan.execute.job.audit import audit_rows
from autoplan.execute.job.routing_audit import measured_imbalance
from autoplan.profile import load_profile
from autoplan.trace import trace
from autoplan.types.moe import RoutingModel
from autoplan.types.plan import Plan

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]

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
    ("tp_sp_gqa", "llama", dict(tp=2, sequence_parallel=True)),
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
FLOPS_ONLY = [("lora_tp_sp", "lora", dict(tp=2, sequence_parallel=True, tp_plan=m.lora_tp_plan(True)))]
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


@pytest.fixture(scope="module")
def audits():
    return {**run_audits(2, CASES + RESHARDING + FLOPS_ONLY + SPARSE), **run_audits(4, FOUR)}


class _Graphs(dict):
    """The traced models by name, and each case's priced side once it is asked for (``_priced``): three
    or four tests read each case's prediction, and pricing a plan costs more than reading it."""

    def __init__(self, traced: dict):
        super().__init__(traced)
        self.priced: dict[str, tuple] = {}


@pytest.fixture(scope="module")
def graphs():
    models = (
        ("gpt", "TinyGPT"),
        ("gpt_tied", "TiedGPT"),
        ("llama", "TinyLlama"),
        ("moe", "TinyMoE"),
        ("moe_skewed", "SkewedMoE"),
        ("llama3p", "ThirdPartyLlama"),
        ("lora", "LoRALlama"),
        ("gpt_sparse", "SparseGPT"),
    )
    return _Graphs({name: trace(getattr(m, cls)(), (m.tokens(2, 1),)) for name, cls in models})


def _case(name):
    return next((model, kw) for case, model, kw in CASES + FOUR + RESHARDING + FLOPS_ONLY + SPARSE if case == name)


def _priced(graphs, name):
    """Case ``name``'s plan, what cost/volumes.py predicts per stage, and each stage's priced peak bytes
    (CostModel's ``stage_memory``), priced once per case."""
    if name not in graphs.priced:
        model, kw = _case(name)
        plan = make_plan(model, **kw)
        profile = dataclasses.replace(load_profile("cpu-gloo"), devices_per_node=8)  # volumes do not depend on the link
        cost_model = CostModel(graphs[model], profile)
        stages, _tp_plan, _ctx = cost_model.priced_stages(plan)
        peaks = [memory.peak_bytes for memory in cost_model.stage_memory(plan, stages)]
        graphs.priced[name] = (plan, predict(cost_model, plan), peaks)
    return graphs.priced[name]


def _predictions(graphs, name):
    plan, predicted, _peaks = _priced(graphs, name)
    return plan, predicted


def _measured(rank: dict) -> dict:
    return {(dim, kind): [count, size] for dim, kind, count, size in rank["comm"]}


#: collectives whose bytes on one rank follow the real routing under ep > 1 (the rows its ep peers send it), priced
#: under balanced routing: as many as priced on every rank, their bytes summed over the ranks exact
ROUTED = {("ep", "all_to_all"), ("etp", "all_to_all")}


@pytest.mark.parametrize("name", [c[0] for c in CASES + FOUR])
def test_collectives_equal_the_priced_volumes(audits, graphs, name):
    result = audits[name]
    assert "error" not in result, result.get("error")
    plan, predicted = _predictions(graphs, name)
    routed = ROUTED if plan.ep > 1 else set()
    summed: dict[tuple, list[float]] = {key: [0.0, 0.0] for key in routed}
    for rank in result["ranks"]:
        expected = predicted[rank["stage"]].comm
        measured = _measured(rank)
        assert set(measured) == set(expected), f"{name}: collectives {sorted(measured)} run, {sorted(expected)} priced"
        for key, (count, size) in expected.items():
            if key in routed:
                summed[key] = [summed[key][0] + measured[key][1], summed[key][1] + size]
            else:
                assert measured[key][1] == pytest.approx(size, rel=1e-9), (
                    f"{name} {key}: {measured[key][1]} bytes run, {size} priced"
                )
            if count is not None:
                assert measured[key][0] == count, f"{name} {key}: {measured[key][0]} collectives run, {count} priced"
    for key, (run, priced) in summed.items():
        assert run == pytest.approx(priced, rel=1e-9), f"{name} {key}: {run} bytes run over the ranks, {priced} priced"


def test_compiled_blocks_generate_the_priced_fused_kernels(audits, graphs):
    """TinyGPT's compiled block: inductor's C++ backend generates one forward kernel per fused region
    the price assumes (ln_1 | residual add + ln_2 | gelu | residual add: cost/compute/fusion.py), once
    for the four identical blocks; audit.csv carries both counts. The backward's kernels are reported
    beside the same count (inductor adds bias-gradient sums and the qkv split's copy)."""
    plan, predicted = _predictions(graphs, "ddp_compile")
    ranks = audits["ddp_compile"]["ranks"]
    rows = audit_rows(ranks=ranks, predictions=predicted, stage_peak_bytes=[0.0] * len(predicted))
    forward = [r for r in rows if r["what"] == "fused kernels forward"]
    assert predicted[0].fused_regions == 4 and len(forward) == len(ranks) == 2
    assert all(r["measured"] == r["predicted"] == 4 and r["as_priced"] for r in forward), forward
    assert all(rank["fused_kernels"][1] >= 4 for rank in ranks)
    assert not any(
        r["what"].startswith("fused")
        for r in audit_rows(
            ranks=audits["ddp"]["ranks"], predictions=_predictions(graphs, "ddp")[1], stage_peak_bytes=[0.0]
        )
    )


@pytest.mark.parametrize("name", [c[0] for c in CASES + FOUR + SPARSE])
def test_each_rank_holds_the_priced_parameter_shard(audits, graphs, name):
    plan, predicted = _predictions(graphs, name)
    for rank in audits[name]["ranks"]:
        held = rank["placement"]["param_elements"]
        assert held == pytest.approx(predicted[rank["stage"]].param_elements, rel=0.02), name


def _powersgd_flops(graphs, plan) -> float:
    """The PowerSGD hook's three matmuls per compressed matrix (M Q, M^T P, P Q^T), priced as
    compression time (autoplan/cost/dp/compression.py), not as model FLOPs. M Q runs on the
    backward's thread; the other two run in the callbacks of its all-reduces' futures, on
    whichever thread completes them (gloo's, unseen by a thread-local dispatch mode, or this one
    when the future is already done), so the meter sees between a third and all of them."""
    if plan.grad_compression != "powersgd":
        return 0.0
    shapes = [info.shape for info in graphs["gpt"].parameters.values()]
    return traffic_of(shapes, plan.powersgd_rank).matmul_flops


#: Families whose peak a thread-local meter cannot see whole: PowerSGD's hook allocates its
#: decompressed matrices and new error in future callbacks, on whichever thread completes the
#: all-reduce (see _powersgd_flops), so the measured peak depends on thread timing. Its priced
#: memory is checked through the user's path instead, on a model large enough for the backward's
#: peak to dominate: benchmarks/audit.py's ddp_powersgd row (benchmarks/results/audit.csv).
MEMORY_UNSEEN = {"ddp_powersgd"}
#: Families whose experts are written as a loop over ``weight[e]`` (TinyMoE, transformers'
#: eager experts): the backward of each ``weight[e]`` is a whole ``[E, ...]`` zero tensor with one
#: expert's slice filled, summed into the weight's gradient, a transient of a few expert-weight
#: gradients that no plan changes (the same bytes at dp, tp and tp with SP) and that the grouped
#: GEMM the cost model prices does not have. Their memory is held through the user's path on a
#: grouped-GEMM model instead: test_mixtral_under_sequence_parallelism_runs_as_priced.
LOOP_EXPERTS = {
    "moe_tp",
    "moe_tp_sp",
    "moe_tp_sp_recompute_selective",
    "moe_tp_sp_etp",
    "moe_dp_tp_sp_ep_etp",
    "moe_dp_tp_sp_etp_zero1",
}
#: FSDP2 hooks a unit's post-backward on forward inputs that need a gradient; the first block behind
#: a frozen embedding has none, so it stays gathered until the backward's final callback reduces and
#: reshards it. Whether that overlaps the previous unit's asynchronous gloo reduce-scatter is up to
#: thread timing: one rank then peaks a block's gathered weights higher (+4% or +16% of the priced
#: peak in repeated runs, never between). Its stage's lowest peak is held to 10% as every other's.
ASYNC_FINAL_RESHARD = {"frozen_zero3"}
#: Families priced at the routing the run measured, not the plan's: their own test
MEASURED_ROUTING = {"moe_ep_skewed"}


def _routed_flops(name: str, ranks: list[dict], predicted: list) -> None:
    """Under ep > 1 a rank's expert GEMMs run on the rows routed to it: every rank's matmul FLOPs summed equal the
    priced ones summed (balanced routing), as the routed all-to-alls' bytes do (ROUTED)."""
    for key in ("forward_flops", "backward_flops", "attention_forward_flops", "attention_backward_flops"):
        run, priced = sum(r[key] for r in ranks), sum(getattr(predicted[r["stage"]], key) for r in ranks)
        assert run == pytest.approx(priced, rel=1e-9), f"{name} {key}: {run} run over the ranks, {priced} priced"


@pytest.mark.parametrize("name", [c[0] for c in CASES + FOUR + FLOPS_ONLY + SPARSE])
def test_each_rank_computes_the_priced_flops(audits, graphs, name):
    plan, predicted = _predictions(graphs, name)
    hook = _powersgd_flops(graphs, plan)
    if plan.ep > 1:
        _routed_flops(name, audits[name]["ranks"], predicted)
        return
    for rank in audits[name]["ranks"]:
        pred = predicted[rank["stage"]]
        assert rank["forward_flops"] == pytest.approx(pred.forward_flops, rel=1e-9), name
        if hook:  # M Q always on the backward's thread; M^T P and P Q^T wherever their future completes
            assert pred.backward_flops + hook / 3 <= rank["backward_flops"] <= pred.backward_flops + hook, name
        else:
            assert rank["backward_flops"] == pytest.approx(pred.backward_flops, rel=1e-9), (
                name
            )  # recomputation included
        assert rank["attention_forward_flops"] == pytest.approx(pred.attention_forward_flops, rel=1e-9), name
        # flash attention's backward recomputes the scores (5 matmuls, priced as cost/compute/roofline.py
        # executed_bwd_flops); full recomputation adds the forward
        assert rank["attention_backward_flops"] == pytest.approx(pred.attention_backward_flops, rel=1e-9), name


@pytest.mark.parametrize(
    "name", [c[0] for c in CASES + FOUR + SPARSE if c[0] not in MEMORY_UNSEEN | LOOP_EXPERTS | MEASURED_ROUTING]
)
def test_each_stage_peaks_within_ten_percent_of_the_priced_memory(audits, graphs, name):
    """The ranks of one stage run the same program; gloo finishes an asynchronous collective (and
    frees what it holds) at a time the scheduler picks, so one rank may peak a few percent above
    the others. The stage's lowest peak is held to 10%, every rank to 15%."""
    priced = _priced(graphs, name)[2]
    by_stage: dict[int, list[int]] = {}
    for rank in audits[name]["ranks"]:
        by_stage.setdefault(rank["stage"], []).append(rank["peak_live_bytes"])
    for stage, peaks in by_stage.items():
        assert min(peaks) == pytest.approx(priced[stage], rel=0.10), (
            f"{name} stage {stage}: peaks {peaks} bytes live, {priced[stage]:.0f} priced"
        )
        if name not in ASYNC_FINAL_RESHARD:
            assert max(peaks) == pytest.approx(priced[stage], rel=0.15), (
                f"{name} stage {stage}: peaks {peaks} bytes live, {priced[stage]:.0f} priced"
            )


def test_the_busiest_ep_rank_peaks_as_priced_at_the_measured_imbalance(audits, graphs):
    """SkewedMoE at dp = ep = 2: the audit reports the rows each rank's experts received (routing_audit.py); their
    max over the mean is the run's imbalance, well above the default model's 1.25; priced again at it, the
    busiest rank's peak (its expert activations that many times the mean, cost/blocks.py) is within 10%, where
    the balanced price is not, and the other rank's within 10% of the balanced one."""
    ranks = audits["moe_ep_skewed"]["ranks"]
    assert "error" not in audits["moe_ep_skewed"], audits["moe_ep_skewed"].get("error")
    imbalance = measured_imbalance(ranks)[0]
    assert imbalance > 1.5, [r["expert_rows"] for r in ranks]
    received = [r for r in audit_rows(ranks=ranks, predictions=_predictions(graphs, "moe_ep_skewed")[1],
                                      stage_peak_bytes=[0.0]) if r["what"] == "expert rows received"]  # fmt: skip
    assert max(r["measured"] / r["predicted"] for r in received) == pytest.approx(imbalance)
    busiest, other = sorted(ranks, key=lambda r: -r["expert_rows"])
    peak = {}
    for i in (1.0, imbalance):
        plan = make_plan("moe_skewed", dp=2, ep=2, routing=RoutingModel(imbalance=i))
        model = CostModel(graphs["moe_skewed"], dataclasses.replace(load_profile("cpu-gloo"), devices_per_node=8))
        peak[i] = model.stage_memory(plan, model.priced_stages(plan)[0])[0].peak_bytes
    assert busiest["peak_live_bytes"] == pytest.approx(peak[imbalance], rel=0.10), (busiest["peak_live_bytes"], peak)
    assert busiest["peak_live_bytes"] > peak[1.0] * 1.10 and other["peak_live_bytes"] == pytest.approx(
        peak[1.0], rel=0.10
    )


def test_sparse_embedding_rows_within_the_estimates_bound(audits, graphs):
    """The dense buckets' all-reduce is byte for byte the priced one without the table; the rows each rank
    touched (recorded in audit.csv as "comm dp touched_rows") lie within 4 standard deviations of U, and
    the two all-gathers carry p times those rows' indices and values (cost/dp/sparse_embedding.py)."""
    result = audits["ddp_sparse_embedding"]
    assert "error" not in result, result.get("error")
    plan, predicted = _predictions(graphs, "ddp_sparse_embedding")
    [table] = sparse_tables(graphs["gpt_sparse"])
    reads = reads_per_rank(table, plan)
    expected, sd = table.rows_per_rank(reads), distinct_rows_sd(table.rows, reads)
    priced = predicted[0].comm
    for rank in result["ranks"]:
        measured = _measured(rank)
        assert set(measured) == set(priced), f"collectives {sorted(measured)} run, {sorted(priced)} priced"
        assert measured[("dp", "all_reduce")][1] == priced[("dp", "all_reduce")][1]
        count, rows = measured[("dp", "touched_rows")]
        assert count == 1 and rows <= min(reads, table.rows) and abs(rows - expected) <= 4 * sd, (rows, expected, sd)
        row_bytes = table.dim * table.value_bytes + INDEX_BYTES
        assert measured[("dp", "all_gather")] == [2, plan.dp * rows * row_bytes]
        assert priced[("dp", "all_gather")][1] == pytest.approx(plan.dp * expected * row_bytes, rel=1e-9)


def test_recomputation_runs_what_it_is_priced_for(audits):
    plain = audits["ddp"]["ranks"][0]
    full, selective = audits["recompute_full"]["ranks"][0], audits["recompute_selective"]["ranks"][0]
    assert full["forward_flops"] == plain["forward_flops"]
    # full re-runs the blocks' forward matmuls inside the backward; selective keeps matmul outputs
    assert full["backward_flops"] > plain["backward_flops"] * 1.2
    assert selective["backward_flops"] == plain["backward_flops"]
    assert full["peak_live_bytes"] < plain["peak_live_bytes"]
    # half the blocks recomputed re-run half the forward matmuls: between none and every block
    half = audits["recompute_budget_full"]["ranks"][0]
    rerun, rerun_half = (
        full["backward_flops"] - plain["backward_flops"],
        half["backward_flops"] - plain["backward_flops"],
    )
    assert rerun_half == pytest.approx(rerun / 2, rel=1e-9)
    assert full["peak_live_bytes"] < half["peak_live_bytes"] < plain["peak_live_bytes"]


def test_activation_offload_moves_what_it_is_priced_for(audits):
    """The copies out and back are the same bytes, and the device's peak falls below the same plan's without."""
    plain, offloaded = audits["ddp"]["ranks"][0], audits["offload_activations"]["ranks"][0]
    rows = {kind: size for dim, kind, _count, size in offloaded["comm"] if dim == "host"}
    assert rows["act_d2h"] == rows["act_h2d"] > 0
    assert offloaded["peak_live_bytes"] < plain["peak_live_bytes"]
    assert offloaded["backward_flops"] == plain["backward_flops"]  # nothing recomputed


def _audit_rows(audits, graphs, name):
    _plan, predicted, peaks = _priced(graphs, name)
    return audit_rows(ranks=audits[name]["ranks"], predictions=predicted, stage_peak_bytes=peaks)


def test_the_audit_counts_in_place_reshards_as_unpriced(audits, graphs):
    """The executor's in-place fallback (execute/dtensor_handlers.py) all-gathers what the plan
    priced as sharded: the audit's "in-place reshards" row says how often, never as priced; a
    plan without it has the row at 0, as priced."""
    assert "error" not in audits["tp_inplace_reshard"], audits["tp_inplace_reshard"].get("error")
    reshards = [r for r in _audit_rows(audits, graphs, "tp_inplace_reshard") if r["what"] == "in-place reshards"]
    assert len(reshards) == 2 and all(r["measured"] > 0 and not r["as_priced"] for r in reshards)
    clean = [r for r in _audit_rows(audits, graphs, "tp_gqa") if r["what"] == "in-place reshards"]
    assert len(clean) == 2 and all(r["measured"] == 0 and r["as_priced"] for r in clean)


def test_mixtral_under_sequence_parallelism_runs_as_priced(tmp_path):
    """Hugging Face Mixtral (grouped expert GEMMs) at tp=2 with SP and selective recomputation,
    through `autoplan run --verify --audit`: the MoE blocks run on each rank's sequence shard, so
    every collective is as priced (count and bytes), the backward does not re-run the grouped
    GEMMs (matmul FLOPs as priced), peak memory is within 10%, and the step matches the reference."""
    pytest.importorskip("transformers")
    sizes = dict(LAYERS=2, DIM=64, HEADS=4, FFN=128, EXPERTS=4, VOCAB=512, SEQ=32)
    env = {**os.environ, **{f"AUTOPLAN_HF_MIXTRAL_{k}": str(v) for k, v in sizes.items()}}
    model = ROOT / "examples" / "hf_mixtral.py"
    plan = Plan(devices=2, dp=1, tp=2, pp=1, sequence_parallel=True, recompute="selective", micro_batch_size=2,
                num_microbatches=2, stages=[["model.layers.0", "model.layers.1"]], routing=RoutingModel(),
                profile="cpu-gloo")  # fmt: skip
    plan_file = str(plan.save(tmp_path / "plan.json"))
    command = [sys.executable, "-m", "autoplan.cli", "run", str(model), "--plan", plan_file,
               "--steps", "2", "--verify", "--audit", "--out", str(tmp_path / "run")]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=ROOT, env=env)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "verify: PASSED" in result.stdout
    rows = list(csv.DictReader((tmp_path / "run" / "audit.csv").open()))
    comm = [r for r in rows if r["what"].startswith("comm")]
    assert comm and all(r["as_priced"] == "True" for r in comm), [r for r in comm if r["as_priced"] != "True"]
    flops = [r for r in rows if "matmul FLOPs" in r["what"]]
    assert len(flops) == 4 and all(r["as_priced"] == "True" for r in flops), flops
    memory = [abs(float(r["relative_error"])) for r in rows if r["what"] == "peak live memory"]
    assert len(memory) == 2 and max(memory) <= 0.10, memory
