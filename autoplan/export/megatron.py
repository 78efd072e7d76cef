"""A plan as Megatron-LM's command-line arguments, and such arguments read back (docs/export-megatron.md).

The file, ``megatron_args.txt``, holds one flag per line and ``#`` comments; the launch line
passes it as ``$(grep -v '^#' megatron_args.txt)``. The flags are those of Megatron-LM at tag
``core_v0.16.1`` (the megatron-core 0.16.1 wheel), where most are generated from megatron-core's
``TransformerConfig`` and ``DistributedDataParallelConfig`` fields. Plan field → flags:

=================== ==========================================================================
plan                Megatron-LM
=================== ==========================================================================
tp, pp, ep          ``--tensor-model-parallel-size``, ``--pipeline-model-parallel-size``,
                    ``--expert-model-parallel-size``; dp = world / (tp·pp·cp) comes from WORLD_SIZE
virtual_stages v    ``--num-layers-per-virtual-pipeline-stage layers/(pp·v)`` (even stages), else
                    ``--num-virtual-stages-per-pipeline-rank v``; Megatron runs 1F1B, interleaved
                    when v > 1; GPipe has no switch (named)
stages (v = 1)      uneven: ``--decoder-first/last-pipeline-num-layers`` when the middle stages are equal
sequence_parallel   ``--sequence-parallel``; tp_comm_overlap → ``--tp-comm-overlap``
micro-batches       ``--micro-batch-size mbs``, ``--global-batch-size dp·mbs·n``
zero_stage 1        ``--use-distributed-optimizer``
zero_stage 2, 3     Megatron-FSDP: ``--use-megatron-fsdp --data-parallel-sharding-strategy
                    optim_grads`` (2) or ``optim_grads_params`` (3), with ``--ckpt-format fsdp_dtensor``
                    (which Megatron-FSDP requires)
recompute           selective → ``--recompute-granularity selective`` (Megatron re-runs the attention
                    core, autoplan's selective is op-level: named); full → ``--recompute-granularity
                    full --recompute-method uniform --recompute-num-layers 1``
precision           bf16 → ``--bf16``; fp16 → ``--fp16``; fp8 → ``--bf16 --fp8-format hybrid
                    --fp8-recipe tensorwise`` (e4m3 forward, e5m2 gradients, per-tensor scaling)
grad_reduce_dtype   fp32 with 16-bit training → ``--accumulate-allreduce-grads-in-fp32``; bf16 →
                    ``--grad-reduce-in-bf16``; fp16 with fp16 training is Megatron's default
overlap_grad_reduce ``--overlap-grad-reduce``; absent, Megatron reduces after the backward
model facts         ``--num-layers``, ``--hidden-size``, ``--num-attention-heads``,
                    ``--group-query-attention --num-query-groups``, ``--seq-length``,
                    ``--max-position-embeddings``; a missing fact is a comment naming its flag
=================== ==========================================================================

Also named in ``unexpressed``: PowerSGD, uneven pipeline stages, reduction dtypes Megatron has no
switch for, and a per-op ``tp_plan`` (:func:`split_note`).

:func:`read` takes the same file, or a one-line argument string. Megatron's arguments do not
state the world size (torchrun sets WORLD_SIZE), so ``devices`` is needed unless the file has
the exporter's ``# world size: N`` line. Context parallelism and flags autoplan does not price
are listed in ``unmapped``, one sentence each.
"""

from __future__ import annotations

import re
import shlex
from typing import Any

from autoplan.export.common import (
    Exported,
    ExportError,
    Imported,
    ModelFacts,
    comment_lines,
    layers_per_stage,
    split_note,
)
from autoplan.types.plan import Plan

FILENAME = "megatron_args.txt"
GPUS_PER_NODE = 8  # a plan does not say how its devices sit in nodes; the launch line assumes up to 8
SHARDING = {2: "optim_grads", 3: "optim_grads_params"}
UNEVEN = ("--decoder-first-pipeline-num-layers", "--decoder-last-pipeline-num-layers")
#: Flags read back that take a value; every other known flag is a switch.
VALUED = {
    "--tensor-model-parallel-size", "--pipeline-model-parallel-size", "--context-parallel-size",
    "--expert-model-parallel-size", "--num-layers-per-virtual-pipeline-stage", "--num-virtual-stages-per-pipeline-rank",
    "--micro-batch-size", "--global-batch-size", "--recompute-granularity", "--recompute-method",
    "--recompute-num-layers", "--recompute-modules", "--fp8-format", "--fp8-recipe",
    "--data-parallel-sharding-strategy", "--ckpt-format", "--num-layers", "--hidden-size", "--num-attention-heads",
    "--num-query-groups", "--seq-length", "--max-position-embeddings", "--vocab-size",
    "--decoder-first-pipeline-num-layers", "--decoder-last-pipeline-num-layers",
}  # fmt: skip
SWITCHES = {
    "--sequence-parallel", "--tp-comm-overlap", "--use-distributed-optimizer", "--use-megatron-fsdp",
    "--use-custom-fsdp", "--use-torch-fsdp2", "--torch-fsdp2-no-reshard-after-forward", "--bf16", "--fp16",
    "--grad-reduce-in-bf16", "--accumulate-allreduce-grads-in-fp32", "--overlap-grad-reduce",
    "--group-query-attention", "--recompute-activations",
}  # fmt: skip

Flags = list[tuple[str, Any]]  # (flag, value); None for a switch


# ---- export ------------------------------------------------------------------------------------
def export(plan: Plan, facts: ModelFacts) -> Exported:
    """The plan as Megatron-LM arguments (module docstring); what they cannot say is in ``unexpressed``."""
    notes: list[str] = []
    remarks: list[str] = []
    flags = _model_flags(facts, remarks)
    if plan.ep > 1:
        remarks.append(
            f"--num-experts and --moe-router-topk: the model's expert count and top-k (ep={plan.ep} needs them; "
            "Megatron refuses expert parallelism without --num-experts)."
        )
    flags += _parallel_flags(plan, facts, notes)
    flags += [("--micro-batch-size", plan.micro_batch_size), ("--global-batch-size", plan.global_batch_size)]
    flags += _data_parallel_flags(plan)
    flags += _precision_flags(plan, notes)
    flags += _recompute_flags(plan, notes)
    notes += _general_notes(plan)
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
    if plan.ep > 1:
        flags.append(("--expert-model-parallel-size", plan.ep))
    if plan.pp > 1:
        flags += _pipeline_flags(plan, facts, notes)
    return flags


def _pipeline_flags(plan: Plan, facts: ModelFacts, notes: list[str]) -> Flags:
    if plan.schedule == "gpipe":
        notes.append("GPipe schedule: Megatron-LM runs 1F1B (fewer micro-batches in flight); it has no GPipe switch.")
    chunks = plan.pp * plan.virtual_stages
    per_chunk = layers_per_stage(plan)
    if plan.stages and per_chunk is None:
        sizes = [len(stage) for stage in plan.stages]
        if plan.virtual_stages == 1 and len(set(sizes[1:-1])) <= 1:  # Megatron splits the rest evenly
            return [
                ("--decoder-first-pipeline-num-layers", sizes[0]),
                ("--decoder-last-pipeline-num-layers", sizes[-1]),
            ]
        notes.append(
            f"uneven pipeline stages: Megatron-LM splits the layers evenly over the {chunks} chunks, or over the "
            "middle stages only (--pipeline-model-parallel-layout can list them by hand)."
        )
    if plan.virtual_stages == 1:
        return []
    if per_chunk is None and not plan.stages and facts.layers and facts.layers % chunks == 0:
        per_chunk = facts.layers // chunks
    if per_chunk is None:
        return [("--num-virtual-stages-per-pipeline-rank", plan.virtual_stages)]
    return [("--num-layers-per-virtual-pipeline-stage", per_chunk)]


def _data_parallel_flags(plan: Plan) -> Flags:
    flags: Flags = [("--overlap-grad-reduce", None)] if plan.overlap_grad_reduce else []
    if plan.zero_stage == 1:
        flags.append(("--use-distributed-optimizer", None))
    elif plan.zero_stage >= 2:
        flags += [
            ("--use-megatron-fsdp", None),
            ("--data-parallel-sharding-strategy", SHARDING[plan.zero_stage]),
            ("--ckpt-format", "fsdp_dtensor"),
        ]
    return flags


def _precision_flags(plan: Plan, notes: list[str]) -> Flags:
    flags: Flags = {"fp32": [], "fp16": [("--fp16", None)]}.get(plan.precision, [("--bf16", None)])
    if plan.precision == "fp8":
        flags += [("--fp8-format", "hybrid"), ("--fp8-recipe", "tensorwise")]
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
    return notes


def _launch(plan: Plan) -> str:
    per_node = max(g for g in range(1, GPUS_PER_NODE + 1) if plan.devices % g == 0)
    nodes = plan.devices // per_node
    rdzv = " --rdzv-backend c10d --rdzv-endpoint $HEAD_NODE:29500" if nodes > 1 else ""
    env = "CUDA_DEVICE_MAX_CONNECTIONS=1 " if plan.tp > 1 and plan.zero_stage < 2 else ""
    return (
        f"{env}torchrun --nnodes {nodes} --nproc-per-node {per_node}{rdzv} pretrain_gpt.py "
        f"$(grep -v '^#' {FILENAME}) $DATA_ARGS"
    )


def _render(flags: Flags, *, header: list[str], notes: list[str], remarks: list[str]) -> str:
    lines = [f"# {h}" for h in header]
    lines += comment_lines("Megatron-LM", notes=notes, remarks=remarks)
    lines += [flag if value is None else f"{flag} {value}" for flag, value in flags]
    return "\n".join(lines) + "\n"


# ---- read --------------------------------------------------------------------------------------
def read(text: str, *, devices: int | None = None, batch_size: int | None = None) -> Imported:
    """Megatron-LM arguments (a file or one line) read back into Plan fields (module docstring)."""
    args, unmapped = _parse(text)
    world = devices or _world_from(text)
    if world is None:
        raise ExportError("Megatron-LM's arguments do not state the world size (torchrun sets it); pass devices.")
    assumptions = [f"world size {world} from {'--devices' if devices else 'the file'} (torchrun sets it)."]
    fields = _read_degrees(args, world, unmapped)
    fields.update(_read_batch(args, fields["dp"], batch_size, assumptions))
    fields.update(_read_precision(args, unmapped))
    fields["recompute"] = _read_recompute(args, unmapped)
    fields.update(_read_data_parallel(args, fields["dp"], unmapped))
    facts = ModelFacts(
        layers=_int(args, "--num-layers"),
        hidden_size=_int(args, "--hidden-size"),
        num_heads=_int(args, "--num-attention-heads"),  # KV heads: the query groups with GQA, else one per head
        num_kv_heads=_int(args, "--num-query-groups" if "--group-query-attention" in args else "--num-attention-heads"),
        seq_len=_int(args, "--seq-length"),
        vocab_size=_int(args, "--vocab-size"),
    )
    pad = _int(args, "--make-vocab-size-divisible-by", 128) * fields["tp"]  # Megatron pads the vocabulary
    return Imported("megatron", fields, unmapped, facts=facts, assumptions=assumptions, vocab_multiple=pad)


def _parse(text: str) -> tuple[dict[str, Any], list[str]]:
    """Flags and their values (True for a switch), and one sentence per flag autoplan does not read."""
    tokens = shlex.split("\n".join(line.split("#", 1)[0] for line in text.splitlines()))
    args: dict[str, Any] = {}
    unmapped: list[str] = []
    i = 0
    while i < len(tokens):
        flag, i = tokens[i], i + 1
        if not flag.startswith("--"):
            raise ExportError(f"'{flag}' is not a --flag or a flag's value.")
        values = []
        while i < len(tokens) and not tokens[i].startswith("--") and (flag not in SWITCHES):
            values, i = values + [tokens[i]], i + 1
        if flag in SWITCHES:
            args[flag] = True
        elif flag in VALUED:
            if not values:
                raise ExportError(f"{flag} needs a value.")
            args[flag] = values if flag == "--recompute-modules" else values[0]
        else:
            shown = f"{flag} {' '.join(values)}".strip()
            unmapped.append(f"{shown}: not a setting autoplan prices; ignored.")
    return args, unmapped


def _world_from(text: str) -> int | None:
    match = re.search(r"^#\s*world size:\s*(\d+)", text, flags=re.MULTILINE)
    return int(match.group(1)) if match else None


def _int(args: dict[str, Any], flag: str, default: int | None = None) -> int | None:
    if flag not in args:
        return default
    try:
        return int(args[flag])
    except ValueError:
        raise ExportError(f"{flag} {args[flag]}: expected an integer.") from None


def _read_degrees(args: dict[str, Any], world: int, unmapped: list[str]) -> dict[str, Any]:
    tp, pp = _int(args, "--tensor-model-parallel-size", 1), _int(args, "--pipeline-model-parallel-size", 1)
    cp, ep = _int(args, "--context-parallel-size", 1), _int(args, "--expert-model-parallel-size", 1)
    if world % (tp * pp * cp):
        raise ExportError(f"world size {world} is not divisible by tp {tp} x pp {pp} x cp {cp}.")
    dp = world // (tp * pp * cp)
    if cp > 1:
        unmapped.append(f"--context-parallel-size {cp}: autoplan does not price context parallelism; read without it.")
    virtual = _read_virtual(args, pp)
    given = [f"{flag} {args[flag]}" for flag in UNEVEN if flag in args]
    if given and pp > 1:
        unmapped.append(f"{' '.join(given)}: uneven stages; autoplan reads a config with balanced stages.")
    sp = tp > 1 and "--sequence-parallel" in args
    return {
        "devices": dp * tp * pp,
        "dp": dp,
        "tp": tp,
        "pp": pp,
        "ep": ep,
        "schedule": "interleaved_1f1b" if virtual > 1 else "1f1b",
        "virtual_stages": virtual,
        "sequence_parallel": sp,
        "tp_comm_overlap": sp and "--tp-comm-overlap" in args,
    }


def _read_virtual(args: dict[str, Any], pp: int) -> int:
    if pp == 1:
        return 1
    if "--num-virtual-stages-per-pipeline-rank" in args:
        return _int(args, "--num-virtual-stages-per-pipeline-rank")
    per_chunk = _int(args, "--num-layers-per-virtual-pipeline-stage")
    if per_chunk is None:
        return 1
    layers = _int(args, "--num-layers")
    if layers is None:
        raise ExportError("--num-layers-per-virtual-pipeline-stage needs --num-layers to give the virtual stages.")
    if layers % (pp * per_chunk):
        raise ExportError(f"--num-layers {layers} is not divisible by pp {pp} x {per_chunk} layers per virtual stage.")
    return layers // (pp * per_chunk)


def _read_batch(args: dict[str, Any], dp: int, batch_size: int | None, assumptions: list[str]) -> dict[str, Any]:
    mbs, global_batch = _int(args, "--micro-batch-size", 1), _int(args, "--global-batch-size")
    assumptions += [] if "--micro-batch-size" in args else ["--micro-batch-size not stated (Megatron requires it): 1."]
    if global_batch is None:  # Megatron-LM's default: one micro-batch per data-parallel rank
        global_batch = batch_size or mbs * dp
        how = "from --batch" if batch_size else f"Megatron-LM's default micro-batch {mbs} x dp {dp}"
        assumptions.append(f"--global-batch-size not stated: read as {global_batch} ({how}).")
    if global_batch % (mbs * dp):
        raise ExportError(f"--global-batch-size {global_batch} is not divisible by --micro-batch-size {mbs} x dp {dp}.")
    return {"micro_batch_size": mbs, "num_microbatches": global_batch // (mbs * dp)}


def _read_precision(args: dict[str, Any], unmapped: list[str]) -> dict[str, Any]:
    precision = "bf16" if "--bf16" in args else "fp16" if "--fp16" in args else "fp32"
    if "--fp8-format" in args:
        precision = "fp8"
        if args.get("--fp8-recipe", "delayed") != "tensorwise":
            recipe = args.get("--fp8-recipe", "delayed")
            unmapped.append(f"--fp8-recipe {recipe}: autoplan prices dynamic tensorwise scaling; read as fp8.")
    if precision in ("bf16", "fp8"):
        reduce = "bf16" if "--grad-reduce-in-bf16" in args else "fp32"
    elif precision == "fp16":
        reduce = "fp32" if "--accumulate-allreduce-grads-in-fp32" in args else "fp16"
    else:
        reduce = "fp32"
    return {"precision": precision, "grad_reduce_dtype": reduce}


def _read_recompute(args: dict[str, Any], unmapped: list[str]) -> str:
    granularity = args.get("--recompute-granularity")
    if granularity is None:
        return "selective" if "--recompute-activations" in args else "none"
    if granularity not in ("full", "selective"):
        raise ExportError(f"--recompute-granularity {granularity}: expected full or selective.")
    if granularity == "full":
        method, count = args.get("--recompute-method", "uniform"), _int(args, "--recompute-num-layers", 1)
        if (method, count) != ("uniform", 1):
            unmapped.append(
                f"--recompute-method {method} --recompute-num-layers {count}: autoplan prices full recompute "
                "of every block; read as that."
            )
    return granularity


def _read_data_parallel(args: dict[str, Any], dp: int, unmapped: list[str]) -> dict[str, Any]:
    zero = 1 if "--use-distributed-optimizer" in args else 0
    if "--use-megatron-fsdp" in args or "--use-custom-fsdp" in args:
        strategy = args.get("--data-parallel-sharding-strategy", "no_shard")
        zero = {"no_shard": zero, "optim": 1, "optim_grads": 2, "optim_grads_params": 3}.get(strategy, zero)
    if "--use-torch-fsdp2" in args:
        zero = 2 if "--torch-fsdp2-no-reshard-after-forward" in args else 3
    overlap = "--overlap-grad-reduce" in args or zero >= 2
    if zero >= 2 and "--overlap-grad-reduce" not in args:
        unmapped.append("FSDP without --overlap-grad-reduce: autoplan prices FSDP's reduce-scatter under the backward.")
    return {"zero_stage": zero, "overlap_grad_reduce": overlap}
