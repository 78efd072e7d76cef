"""A plan as Megatron-LM's command-line arguments, and such arguments read back (the plan-field-to-flag
table and what Megatron-LM cannot express: docs/export-megatron.md, "The mapping").

The file, ``megatron_args.txt``, holds one flag per line and ``#`` comments; the launch line
passes it as ``$(grep -v '^#' megatron_args.txt)``. The flags are those of Megatron-LM at tag
``core_v0.16.1`` (the megatron-core 0.16.1 wheel). ZeRO-1 is ``--use-distributed-optimizer``,
ZeRO-2/3 Megatron-FSDP (``optim_grads`` / ``optim_grads_params``), HSDP's replicas
``--num-distributed-optimizer-instances``; uneven stages are
``--decoder-first/last-pipeline-num-layers`` or ``--pipeline-model-parallel-layout``; context
parallelism is ``--context-parallel-size`` with ``--cp-comm-type`` p2p (ring), all_gather or a2a
(Ulysses). What a flag
cannot say (GPipe, autoplan's op-level selective recompute, some reduction dtypes, PowerSGD, a
per-op ``tp_plan``: :func:`split_note`) goes in ``unexpressed``. :func:`read`
(autoplan/export/megatron_read.py) takes the same file, a one-line argument string, or a launch script.
"""

from __future__ import annotations

from typing import Any

from autoplan.export.activation_offload import megatron_activation_flags
from autoplan.export.common import (
    Exported,
    ModelFacts,
    attention_notes,
    comment_lines,
    frozen_notes,
    layers_per_stage,
    refuse_schedule_steps,
    refuse_v_schedule,
    split_note,
)
from autoplan.export.local_sgd import local_sgd_notes
from autoplan.export.megatron_moe import expert_flags, expert_remarks, overlap_notes
from autoplan.export.megatron_read import read
from autoplan.export.offload import megatron_flags as offload_flags
from autoplan.export.recompute_budget import megatron_flags as recompute_flags
from autoplan.types.offload import one_rank_offload
from autoplan.types.plan import Plan

__all__ = ["FILENAME", "export", "read"]

FILENAME = "megatron_args.txt"
GPUS_PER_NODE = 8  # a plan does not say how its devices sit in nodes; the launch line assumes up to 8
SHARDING = {2: "optim_grads", 3: "optim_grads_params"}
#: autoplan's cp variant -> Megatron's ``--cp-comm-type`` (TransformerConfig.cp_comm_type; the hierarchical
#: ``a2a+p2p`` has no autoplan variant: megatron_read.py reads it as ring)
CP_COMM_TYPES = {"ring": "p2p", "allgather": "all_gather", "ulysses": "a2a"}
#: autoplan's FP8 recipe -> Megatron's ``--fp8-recipe`` (TransformerConfig.fp8_recipe: 'tensorwise' is TE's per-tensor
#: current scaling, 'delayed' its delayed scaling); torchao's recipes have no Megatron twin: the nearest TE recipe
FP8_RECIPES = {"te_current": "tensorwise", "te_delayed": "delayed", "tensorwise": "tensorwise", "rowwise": "tensorwise"}
Flags = list[tuple[str, Any]]  # (flag, value); None for a switch


# ---- export ------------------------------------------------------------------------------------
def export(plan: Plan, facts: ModelFacts) -> Exported:
    """The plan as Megatron-LM arguments (module docstring); what they cannot say is in ``unexpressed``."""
    refuse_v_schedule(plan, framework="Megatron-Core 0.16", runs="loops its virtual pipeline stages over the ranks")
    refuse_schedule_steps(plan, framework="Megatron-LM")
    notes: list[str] = []
    remarks: list[str] = []
    flags = _model_flags(facts, remarks)
    if plan.ep > 1:
        remarks.append(
            f"--num-experts and --moe-router-topk: the model's expert count and top-k (ep={plan.ep} needs them; "
            "Megatron refuses expert parallelism without --num-experts)."
        )
    remarks += expert_remarks(plan)
    flags += _parallel_flags(plan, facts, notes)
    flags += [("--micro-batch-size", plan.micro_batch_size), ("--global-batch-size", plan.global_batch_size)]
    flags += _data_parallel_flags(plan) + offload_flags(plan, notes)
    flags += _precision_flags(plan, notes)
    flags += _recompute_flags(plan, notes) + megatron_activation_flags(plan, facts.layers, notes)
    notes += _general_notes(plan) + overlap_notes(plan) + frozen_notes(facts, "Megatron-LM")
    notes += attention_notes(facts, "Megatron-LM")
    launch = _launch(plan)
    header = [
        f"Megatron-LM (core_v0.16.1) arguments written by autoplan for: {plan.describe()}",
        f"world size: {plan.devices}",
        f"launch: {launch}",
    ]
    text = _render(flags, header=header, notes=notes, remarks=remarks)
    return Exported(framework="megatron", filename=FILENAME, text=text, unexpressed=notes, launch=launch)


def _model_flags(facts: ModelFacts, remarks: list[str]) -> Flags:
    wanted = [
        ("--num-layers", facts.layers),
        ("--hidden-size", facts.hidden_size),
        ("--num-attention-heads", facts.num_heads),
        ("--seq-length", facts.seq_len),
        ("--max-position-embeddings", facts.seq_len),
    ]
    flags = [(flag, value) for flag, value in wanted if value]
    missing = [flag for flag, value in wanted if not value]
    if missing:
        remarks.append(f"{', '.join(missing)}: the trace does not state them; set them to the model's.")
    if facts.num_kv_heads and facts.num_heads and facts.num_kv_heads != facts.num_heads:
        flags += [("--group-query-attention", None), ("--num-query-groups", facts.num_kv_heads)]
    remarks.append(
        "the architecture beyond these sizes (--ffn-hidden-size, --swiglu, --normalization, "
        "--position-embedding-type) and the data and tokenizer flags are the model's and the run's: add them."
    )
    return flags


def _parallel_flags(plan: Plan, facts: ModelFacts, notes: list[str]) -> Flags:
    flags: Flags = [("--tensor-model-parallel-size", plan.tp), ("--pipeline-model-parallel-size", plan.pp)]
    if plan.sequence_parallel:
        flags.append(("--sequence-parallel", None))
    if plan.tp_comm_overlap:
        flags.append(("--tp-comm-overlap", None))
    flags += expert_flags(plan)  # ep, and expert_tp where Megatron's default differs (export/megatron_moe.py)
    if plan.cp > 1:
        flags += _context_parallel_flags(plan, facts, notes)
    if plan.pp > 1:
        flags += _pipeline_flags(plan, facts, notes)
    return flags


def _context_parallel_flags(plan: Plan, facts: ModelFacts, notes: list[str]) -> Flags:
    """``--context-parallel-size`` and its ``--cp-comm-type``; Ulysses (``a2a``) scatters the heads of
    each tensor-parallel rank over the cp ranks, which Transformer Engine refuses unless cp divides them."""
    heads = facts.num_kv_heads or facts.num_heads
    if plan.cp_variant == "ulysses" and heads and (heads % plan.tp or (heads // plan.tp) % plan.cp):
        notes.append(
            f"cp={plan.cp} ulysses: Megatron-LM's a2a scatters the {heads} KV heads over tp {plan.tp} x cp "
            f"{plan.cp}, which do not divide them; Transformer Engine refuses it at the first attention."
        )
    return [("--context-parallel-size", plan.cp), ("--cp-comm-type", CP_COMM_TYPES[plan.cp_variant])]


def _pipeline_flags(plan: Plan, facts: ModelFacts, notes: list[str]) -> Flags:
    if plan.schedule == "gpipe":
        notes.append("GPipe schedule: Megatron-LM runs 1F1B (fewer micro-batches in flight); it has no GPipe switch.")
    if plan.schedule == "interleaved_zb":
        notes.append(
            "zero-bubble schedule (interleaved_zb): Megatron-Core 0.16 has none (its delay_wgrad_compute defers "
            "weight gradients only beside --overlap-moe-expert-parallel-comm); written as "
            f"{'interleaved 1F1B' if plan.virtual_stages > 1 else '1F1B'}, whose bubble keeps the weight gradients."
        )
    chunks = plan.pp * plan.virtual_stages
    per_chunk = layers_per_stage(plan)
    if plan.stages and per_chunk is None:
        sizes = [len(stage) for stage in plan.stages]
        if plan.virtual_stages == 1 and len(set(sizes[1:-1])) <= 1:  # Megatron splits the rest evenly
            return [
                ("--decoder-first-pipeline-num-layers", sizes[0]),
                ("--decoder-last-pipeline-num-layers", sizes[-1]),
            ]
        return [("--pipeline-model-parallel-layout", _layout(sizes))]
    if plan.virtual_stages == 1:
        return []
    if per_chunk is None and not plan.stages and facts.layers and facts.layers % chunks == 0:
        per_chunk = facts.layers // chunks
    if per_chunk is None:
        return [("--num-virtual-stages-per-pipeline-rank", plan.virtual_stages)]
    return [("--num-layers-per-virtual-pipeline-stage", per_chunk)]


def _layout(sizes: list[int]) -> str:
    """Megatron's ``--pipeline-model-parallel-layout`` for chunks of ``sizes`` blocks, in chunk order
    (chunk c on pipeline rank c % pp, as Plan.stages): "|" between chunks, ``t`` a transformer block,
    ``E`` the embedding on the first, ``L`` the loss on the last (megatron/core/transformer/
    pipeline_parallel_layer_layout.py)."""
    chunks = ["t" * n for n in sizes]
    chunks[0], chunks[-1] = "E" + chunks[0], chunks[-1] + "L"
    return "|".join(chunks)


def _data_parallel_flags(plan: Plan) -> Flags:
    flags: Flags = [("--overlap-grad-reduce", None)] if plan.overlap_grad_reduce else []
    flags += [("--overlap-param-gather", None)] if plan.overlap_param_gather else []
    if plan.zero_stage == 1 or one_rank_offload(plan):  # its CPU offload is the distributed optimizer's
        flags.append(("--use-distributed-optimizer", None))
    elif plan.zero_stage >= 2:  # Megatron-FSDP's required flags (module docstring)
        flags += [
            ("--use-megatron-fsdp", None),
            ("--data-parallel-sharding-strategy", SHARDING[plan.zero_stage]),
            ("--use-distributed-optimizer", None),
            ("--no-gradient-accumulation-fusion", None),
            ("--ckpt-format", "fsdp_dtensor"),
        ]
        flags += [("--overlap-param-gather", None)] if plan.zero_stage == 3 else []
    if plan.dp_replicate > 1:  # HSDP: the distributed optimizer (or Megatron-FSDP) per shard group, all-reduced across
        flags.append(("--num-distributed-optimizer-instances", plan.dp_replicate))
    return flags


def _precision_flags(plan: Plan, notes: list[str]) -> Flags:
    flags: Flags = {"fp32": [], "fp16": [("--fp16", None)]}.get(plan.precision, [("--bf16", None)])
    if plan.precision == "fp8":
        flags += [("--fp8-format", "hybrid"), ("--fp8-recipe", FP8_RECIPES[plan.fp8_recipe_used])]
    reduce, training = plan.grad_reduce_dtype, "fp16" if plan.precision == "fp16" else "bf16"
    if plan.precision != "fp32" and reduce == "fp32":
        flags.append(("--accumulate-allreduce-grads-in-fp32", None))
    elif reduce == "bf16" and training == "bf16" and plan.precision != "fp32":
        flags.append(("--grad-reduce-in-bf16", None))
    elif reduce != "fp32" and not (reduce == training == "fp16"):
        notes.append(
            f"gradient reduction in {reduce} with {plan.precision} training: Megatron-LM has no switch for it; "
            "it reduces in the training dtype or in fp32."
        )
    return flags


def _recompute_flags(plan: Plan, notes: list[str]) -> Flags:
    if plan.recompute_blocks:  # the first k layers of each chunk (export/recompute_budget.py)
        flags = recompute_flags(plan, notes)
        if plan.recompute == "full":
            return flags
    if plan.recompute == "full":
        return [("--recompute-granularity", "full"), ("--recompute-method", "uniform"), ("--recompute-num-layers", 1)]
    if plan.recompute == "none":
        return []
    notes.append(
        "selective recompute: Megatron-LM re-runs the attention core (--recompute-modules core_attn); autoplan "
        "priced op-level selective checkpointing (matmul and attention outputs kept, norms and element-wise "
        "ops re-run), so memory and recompute time differ."
    )
    return [("--recompute-granularity", "selective")]


def _general_notes(plan: Plan) -> list[str]:
    notes = [split_note(plan)] if split_note(plan) else []
    if plan.grad_compression == "powersgd":
        notes.insert(0, f"PowerSGD rank {plan.powersgd_rank}: Megatron-LM has no gradient compression.")
    if plan.grad_compression == "topk":
        notes.insert(0, f"top-k sparsification ({plan.topk_ratio:g}): Megatron-LM has no gradient compression.")
    return notes + local_sgd_notes(plan, "Megatron-LM")


def _launch(plan: Plan) -> str:
    per_node = max(g for g in range(1, GPUS_PER_NODE + 1) if plan.devices % g == 0)
    nodes = plan.devices // per_node
    rdzv = " --rdzv-backend c10d --rdzv-endpoint $HEAD_NODE:29500" if nodes > 1 else ""
    # Megatron-LM asserts this for tp or cp > 1 before Blackwell, unless FSDP (validate_args)
    env = "CUDA_DEVICE_MAX_CONNECTIONS=1 " if (plan.tp > 1 or plan.cp > 1) and plan.zero_stage < 2 else ""
    return (
        f"{env}torchrun --nnodes {nodes} --nproc-per-node {per_node}{rdzv} pretrain_gpt.py "
        f"$(grep -v '^#' {FILENAME}) $DATA_ARGS"
    )


def _render(flags: Flags, *, header: list[str], notes: list[str], remarks: list[str]) -> str:
    lines = [f"# {h}" for h in header]
    lines += comment_lines("Megatron-LM", notes=notes, remarks=remarks)
    lines += [flag if value is None else f"{flag} {value}" for flag, value in flags]
    return "\n".join(lines) + "\n"
