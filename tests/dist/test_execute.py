"""Every executor composition against a single-process reference, on real gloo groups.

One spawned group per world size runs all its cases (spawning is the slow part); each case
compares the loss, every parameter's gradient (DTensor shards gathered, FQNs mapped back) and
every updated weight with the unsharded model over the same micro-batches, over the steps
`autoplan run --verify` compares, and asserts its verdict."""

from __future__ import annotations

import exec_tp_plans as tp_plans
import pytest
from exec_harness import run_cases

from autoplan.execute.job.verify import UPDATED

pytestmark = pytest.mark.slow

TWO = [
    ("dp2", "gpt", dict(dp=2)),
    ("tp2", "gpt", dict(tp=2)),
    ("tp2_sp", "gpt", dict(tp=2, sequence_parallel=True)),
    ("tp2_gqa", "llama", dict(tp=2)),
    ("tp2_sp_gqa", "llama", dict(tp=2, sequence_parallel=True)),
    ("pp2_gpipe", "gpt", dict(pp=2, schedule="gpipe")),
    ("pp2_1f1b", "llama", dict(pp=2, schedule="1f1b", num_microbatches=4)),
    ("zero1", "gpt", dict(dp=2, zero_stage=1)),
    ("zero1_overlap_param_gather", "gpt", dict(dp=2, zero_stage=1, overlap_param_gather=True)),
    # the explicit all-reduce on its flat gradient buffer, four micro-batches accumulated into it
    ("allreduce_flat_accumulate", "gpt", dict(dp=2, overlap_grad_reduce=False, num_microbatches=4)),
    ("zero2", "gpt", dict(dp=2, zero_stage=2)),
    # a sparse token embedding: DDP all-reduces its touched rows, the trainer densifies them before AdamW
    ("dp2_sparse_embedding", "gpt_sparse", dict(dp=2)),
    ("zero3", "llama", dict(dp=2, zero_stage=3)),
    ("recompute_full", "gpt", dict(dp=2, recompute="full")),
    ("recompute_selective_tp", "llama", dict(tp=2, recompute="selective")),
    # budgeted recompute: the first block of stage 0 checkpointed, none of stage 1 (types/recompute.py)
    ("pp2_recompute_budget", "gpt", dict(pp=2, schedule="1f1b", recompute="full", recompute_blocks=[1, 0])),
    # low precision: the reference runs the same policy (FSDP2 casts params; else autocast)
    ("zero2_bf16", "gpt", dict(dp=2, zero_stage=2, precision="bf16")),
    ("zero3_fp16", "gpt", dict(dp=2, zero_stage=3, precision="fp16", num_microbatches=2)),
    ("dp2_fp16", "gpt", dict(dp=2, precision="fp16")),
    ("tp2_bf16", "llama", dict(tp=2, precision="bf16")),
    ("pp2_fp16", "gpt", dict(pp=2, schedule="1f1b", precision="fp16")),
    # calibration-sweep regressions (plans the planner emitted that once failed to run)
    (
        "tp2_sp_replicated_attention",
        "gpt",
        dict(tp=2, sequence_parallel=True, tp_plan=tp_plans.gpt_tp_plan(True, attention=False)),
    ),
    # LoRA's replicated adapters beside Megatron's splits under SP: run whole, gradients settled whole
    ("tp2_sp_lora_adapters", "lora", dict(tp=2, sequence_parallel=True, tp_plan=tp_plans.lora_tp_plan(True))),
    (
        "tp2_colwise_embedding_inplace",
        "llama3p",
        dict(tp=2, recompute="full", tp_plan=tp_plans.llama_tp_plan(False, embedding="colwise")),
    ),
    (
        "tp2_sp_colwise_embedding_inplace",
        "llama3p",
        dict(tp=2, sequence_parallel=True, tp_plan=tp_plans.llama_tp_plan(True, embedding="colwise")),
    ),
    (
        "pp2_interleaved_rope_args",
        "llama3p",
        dict(pp=2, schedule="interleaved_1f1b", virtual_stages=2, num_microbatches=4),
    ),
    # ZB-H1 (torch's ScheduleInterleavedZeroBubble, one stage per rank): B and W apart, W of a checkpointed block
    ("pp2_zb_h1_recompute_full", "gpt", dict(pp=2, schedule="interleaved_zb", num_microbatches=2, recompute="full")),
    # zero-bubble over T5's stage outputs made from weights alone (a tied embedding looked up at chunk 1's end, a
    # position bias block 2 makes and sends on): torch's W leaves their gradients out (execute/split_backward.py)
    ("pp2_zb_v2_weight_only_outputs", "gpt_encdec", dict(pp=2, schedule="interleaved_zb", virtual_stages=2)),
    # ZB-H1 over the same model: torch's W, one autograd.grad per parameter group without the graph kept, freed
    # nodes another group's backward needed (T5's last stage); W over the groups as one (execute/split_backward.py)
    ("pp2_zb_h1_shared_nodes", "gpt_encdec", dict(pp=2, schedule="interleaved_zb")),
    # the V schedules (types/layout.py): stage 0 runs chunks 0 and 3 (the loss; a tied embedding's two copies
    # summed on the rank), stage 1 the V's turn, chunks 1, 2
    ("pp2_zbv_tied", "gpt_tied", dict(pp=2, schedule="zbv", virtual_stages=2, num_microbatches=4)),
    ("pp2_dualpipev_gqa", "llama", dict(pp=2, schedule="dualpipev", virtual_stages=2, num_microbatches=4)),
    # context parallelism (execute/context_parallel.py): causal attention over head-tail shards,
    # positions made before the blocks (GPT's arange, Llama's rotary buffers sliced at each block)
    ("cp2_gpt", "gpt", dict(cp=2)),
    ("cp2_gqa_rotary_recompute_full", "llama", dict(cp=2, recompute="full")),
    ("cp2_unmasked_attention", "gpt_bidirectional", dict(cp=2)),
    ("cp2_enable_gqa_recompute_selective", "llama_enable_gqa", dict(cp=2, recompute="selective")),
    ("cp2_ulysses_gqa_recompute_full", "llama", dict(cp=2, cp_variant="ulysses", recompute="full")),
    # an explicit mask made before the blocks (Hugging Face's traced masks): each rank's rows of it
    ("cp2_window_mask_allgather", "gpt_window_mask", dict(cp=2)),
    ("cp2_window_mask_ulysses_recompute_full", "gpt_window_mask", dict(cp=2, cp_variant="ulysses", recompute="full")),
    # torch.compile per block (execute/compiled.py) after TP, SP and recomputation, before FSDP2
    ("tp2_sp_compile_recompute_full", "gpt", dict(tp=2, sequence_parallel=True, compile=True, recompute="full")),
    ("zero3_compile_gqa", "llama", dict(dp=2, zero_stage=3, compile=True)),
    # LoRA: frozen base weights, embedding, norms and head beside trainable adapters (docs/executor.md)
    ("frozen_ddp", "lora", dict(dp=2)),
    ("frozen_allreduce_flat", "lora", dict(dp=2, overlap_grad_reduce=False)),
    ("frozen_zero1_param_gather", "lora", dict(dp=2, zero_stage=1, overlap_param_gather=True)),
    ("frozen_zero3", "lora", dict(dp=2, zero_stage=3)),
    ("frozen_pp2_1f1b", "lora", dict(pp=2, schedule="1f1b", num_microbatches=4)),
    # offload (execute/offload.py): ZeRO-1's master slice and Adam step on the host; FSDP2's CPUOffloadPolicy
    ("zero1_offload_optimizer_bf16", "llama", dict(dp=2, zero_stage=1, offload="optimizer", precision="bf16")),
    ("zero3_offload_full_accumulate", "llama", dict(dp=2, zero_stage=3, offload="full", num_microbatches=2)),
    # activation offload (execute/activation_offload.py): saved activations out to the host and back, under
    # FSDP2, and beside a recompute budget in a pipeline (the blocks that do not recompute offload)
    # ZeRO-Offload on one dp rank (execute/offload.py OneRank): the whole master and Adam state on the host
    ("tp2_offload_optimizer_one_rank", "gpt", dict(tp=2, offload="optimizer")),
    (
        "pp2_offload_optimizer_one_rank_bf16",
        "llama",
        dict(pp=2, schedule="1f1b", num_microbatches=4, offload="optimizer", precision="bf16"),
    ),
    ("zero3_offload_activations", "llama", dict(dp=2, zero_stage=3, offload_activations=True)),
    # expert tensor parallelism (execute/expert_tp.py): each expert's FFN split over the etp = tp ranks, the rows
    # each rank routes from its sequence shard gathered over etp and the partial outputs reduce-scattered
    ("tp2_sp_etp2", "moe", dict(tp=2, sequence_parallel=True, expert_tp=2)),
    (
        "pp2_budget_offload_activations",
        "gpt",
        dict(
            pp=2,
            schedule="1f1b",
            num_microbatches=4,
            recompute="full",
            recompute_blocks=[1, 0],
            offload_activations=True,
        ),
    ),
]
FOUR = [
    ("dp2_tp2", "gpt", dict(dp=2, tp=2)),
    ("pp2_dp2", "llama", dict(pp=2, dp=2)),
    ("pp2_tp2_sp", "gpt", dict(pp=2, tp=2, sequence_parallel=True)),
    ("dp2_tp2_zero3_sp", "llama", dict(dp=2, tp=2, zero_stage=3, sequence_parallel=True)),
    ("pp2_dp2_zero2", "gpt", dict(pp=2, dp=2, zero_stage=2)),
    ("pp2_dp2_interleaved", "gpt", dict(pp=2, dp=2, schedule="interleaved_1f1b", virtual_stages=2, num_microbatches=4)),
    ("dp2_tp2_zero1", "llama", dict(dp=2, tp=2, zero_stage=1)),
    # weights tied across stages on a 4-D (pp, dp, cp, tp) mesh at tp > 1 (execute/tied.py)
    ("pp2_tp2_tied", "gpt_tied", dict(pp=2, tp=2, tp_plan=tp_plans.gpt_tp_plan(False))),
    ("cp2_tp2_sp", "gpt", dict(cp=2, tp=2, sequence_parallel=True)),
    # HSDP: 2 replicas x 2-rank shard groups (ZeRO-1's sharded optimizer; FSDP2 on a 2-D mesh)
    ("hsdp2x2_zero1", "gpt", dict(dp=4, dp_replicate=2, zero_stage=1)),
    ("hsdp2x2_zero3", "llama", dict(dp=4, dp_replicate=2, zero_stage=3)),
    # HSDP beside cp: 2 replicas, each sharding over its dp_shard x cp = 1 x 2 ranks (FSDP2's 2-D mesh)
    ("hsdp2_cp2_zero2", "llama", dict(dp=2, dp_replicate=2, cp=2, zero_stage=2)),
    ("cp2_dp2_ddp", "llama", dict(cp=2, dp=2)),
    ("cp2_tp2_ulysses", "llama", dict(cp=2, tp=2, cp_variant="ulysses")),
    ("cp2_pp2_1f1b_recompute_bf16", "llama", dict(cp=2, pp=2, schedule="1f1b", recompute="full", precision="bf16")),
    ("cp2_tp2_window_mask", "gpt_window_mask", dict(cp=2, tp=2)),
    # MoE Parallel Folding, expert_tp x ep x edp = 2 x 2 x 1 beside dp x tp = 2 x 2: tokens to the ep peer of the
    # other dp replica by all-to-all, then shared over etp around each expert's FFN shard
    ("dp2_tp2_sp_ep2_etp2", "moe", dict(dp=2, tp=2, ep=2, expert_tp=2, sequence_parallel=True)),
    # and under ZeRO-1: dense parameters sharded over dp, the expert shards over their edp pair (execute/zero.py)
    ("dp2_tp2_sp_etp2_zero1", "moe", dict(dp=2, tp=2, expert_tp=2, sequence_parallel=True, zero_stage=1)),
]
#: a model context parallelism cannot shard at its blocks' inputs: one sentence at the first step
REFUSED = [("cp2_skip_from_embedding_to_head", "llama3p", dict(cp=2))]
EIGHT = [("pp2_dp2_tp2", "llama", dict(pp=2, dp=2, tp=2, sequence_parallel=True, zero_stage=1))]


@pytest.fixture(scope="module")
def two():
    return run_cases(2, TWO + REFUSED)


@pytest.fixture(scope="module")
def four():
    return run_cases(4, FOUR)


def _check(results: dict, name: str) -> None:
    """The verdict `autoplan run --verify` gives (autoplan/execute/job/reference.py), over the
    steps it compares, each with the loss, every gradient and every updated weight."""
    errors = {k: v["error"] for k, v in results.items() if k.startswith(name) and "error" in v}
    assert not errors, "\n".join(f"{k}:\n{v}" for k, v in errors.items())
    found = results[name]
    diffs = found["diffs"]
    assert "loss" in diffs and len([k for k in diffs if not k.endswith(UPDATED)]) > 10
    assert len([k for k in diffs if k.endswith(UPDATED)]) > 10
    assert len(found["steps"]) >= 2, found["steps"]  # DDP's rebuilt buckets and the optimizer's states
    assert found["passed"], f"{name}:\n{found['report']}"


@pytest.mark.parametrize("name", [c[0] for c in TWO])
def test_two_ranks_match_reference(two, name):
    _check(two, name)


@pytest.mark.parametrize("name", [c[0] for c in TWO if c[1] == "lora"])
def test_frozen_parameters_leave_every_step_as_they_entered_it(two, name):
    frozen = {k: v for k, v in two[name]["diffs"].items() if k.endswith("(frozen)")}
    assert len(frozen) > 10 and not any(frozen.values()), frozen


@pytest.mark.parametrize("name", [c[0] for c in FOUR])
def test_four_ranks_match_reference(four, name):
    _check(four, name)


def test_eight_ranks_pp_dp_tp_match_reference():
    _check(run_cases(8, EIGHT), EIGHT[0][0])


def test_cp_refuses_a_whole_sequence_tensor_made_outside_the_blocks_in_one_sentence(two):
    name = REFUSED[0][0]
    errors = [v["error"] for k, v in two.items() if k.startswith(name)]
    assert len(errors) == 2, two.get(name)
    assert all(
        "PlanError: context parallelism shards the sequence at the blocks' inputs (4 of 8 tokens" in e for e in errors
    )
