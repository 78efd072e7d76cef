"""Megatron-LM arguments read back into plan fields (docs/export.md), from the exporter's
``megatron_args.txt``, a line of flags, or a launch script as people write them.

A script is read as a shell reads it (autoplan/export/shell.py): line continuations, comments,
quotes, variables and arrays assigned in the script (``GPT_MODEL_ARGS=( ... )``,
``${GPT_MODEL_ARGS[@]}``) and integer arithmetic. Its launch command is the one that runs a
``.py`` training script (``torchrun ... pretrain_gpt.py``, ``python -m torch.distributed.run
...``, ``python pretrain_gpt.py``, ``deepspeed pretrain_gpt.py``): the flags are the words after
the script. Without such a command every word must be a flag. The exporter's own file (every
line a ``#`` comment or a ``--flag``, with no quotes, ``$``, backquotes or backslashes) is split
on whitespace instead, as its launch line's ``$(grep -v '^#' megatron_args.txt)`` splits it, so a
value such as ``--pipeline-model-parallel-layout Et|tt|tL`` keeps its ``|``.

The world size (torchrun sets WORLD_SIZE) is ``devices`` when given, else the exporter's ``# world
size: N`` line, else ``--nproc-per-node`` x ``--nnodes`` (deepspeed's ``--num_gpus`` x ``--num_nodes``).
``--context-parallel-size`` and ``--cp-comm-type`` are read as cp and cp_variant (p2p ring, all_gather,
a2a Ulysses; a2a+p2p and per-layer types as the nearest, with a sentence); the expert layout as
export/megatron_moe.py states it. Flags autoplan does not price are listed in ``unmapped``, one
sentence each, and so are variables the script uses but does not assign (a flag autoplan reads whose
value is such a variable is refused in one sentence naming it).
"""

from __future__ import annotations

import math
import re
from typing import Any

from autoplan.export.common import ExportError, Imported, ModelFacts
from autoplan.export.megatron_moe import MOE_SWITCHES, MOE_VALUED, read_experts
from autoplan.export.offload import megatron_offload
from autoplan.export.shell import Command, Word, read_script

UNEVEN = ("--decoder-first-pipeline-num-layers", "--decoder-last-pipeline-num-layers")
#: Flags read back that take a value; every other known flag is a switch.
VALUED = {
    "--tensor-model-parallel-size", "--pipeline-model-parallel-size", "--context-parallel-size",
    "--expert-model-parallel-size", "--num-layers-per-virtual-pipeline-stage", "--num-virtual-stages-per-pipeline-rank",
    "--micro-batch-size", "--global-batch-size", "--recompute-granularity", "--recompute-method",
    "--recompute-num-layers", "--recompute-modules", "--fp8-format", "--fp8-recipe", "--optimizer-offload-fraction",
    "--data-parallel-sharding-strategy", "--ckpt-format", "--num-layers", "--hidden-size", "--num-attention-heads",
    "--num-query-groups", "--seq-length", "--max-position-embeddings", "--vocab-size", "--make-vocab-size-divisible-by",
    "--decoder-first-pipeline-num-layers", "--decoder-last-pipeline-num-layers", "--pipeline-model-parallel-layout",
    "--cp-comm-type", "--hierarchical-context-parallel-sizes", "--num-distributed-optimizer-instances",
} | MOE_VALUED  # fmt: skip
LISTS = ("--recompute-modules", "--cp-comm-type", "--hierarchical-context-parallel-sizes")  # nargs="+" flags
#: Megatron's ``--cp-comm-type`` (TransformerConfig.cp_comm_type) -> autoplan's cp variant; a2a+p2p: _read_cp
CP_VARIANTS = {"p2p": "ring", "all_gather": "allgather", "a2a": "ulysses", "a2a+p2p": "ring"}
#: Megatron's ``--fp8-recipe`` (default delayed) -> autoplan's Transformer Engine recipe (types/runtime.py)
FP8_RECIPES = {"tensorwise": "te_current", "delayed": "te_delayed"}
SWITCHES = {
    "--sequence-parallel", "--tp-comm-overlap", "--use-distributed-optimizer", "--use-megatron-fsdp",
    "--use-custom-fsdp", "--use-torch-fsdp2", "--torch-fsdp2-no-reshard-after-forward", "--bf16", "--fp16",
    "--grad-reduce-in-bf16", "--accumulate-allreduce-grads-in-fp32", "--overlap-grad-reduce",
    "--overlap-param-gather", "--no-gradient-accumulation-fusion", "--group-query-attention",
    "--recompute-activations", "--optimizer-cpu-offload", "--use-precision-aware-optimizer",
} | MOE_SWITCHES  # fmt: skip
#: Launcher options giving processes per node and nodes (torchrun, torch.distributed.launch, deepspeed).
PER_NODE = ("--nproc-per-node", "--nproc_per_node", "--num_gpus", "--num-gpus")
NODES = ("--nnodes", "--num_nodes", "--num-nodes")


def read(text: str, *, devices: int | None = None, batch_size: int | None = None) -> Imported:
    """Megatron-LM arguments (a file, one line or a launch script) read back into Plan fields
    (module docstring)."""
    words, launcher_world = _script_flags(text)
    args, unmapped = _parse(words)
    world = devices or _world_from(text) or launcher_world
    if world is None:
        raise ExportError(
            "Megatron-LM's arguments do not state the world size (torchrun sets it); pass devices (--devices)."
        )
    source = "" if devices or _world_from(text) else " (the launcher's processes per node x nodes: pass --devices)"
    told = "--devices" if devices else "the file" if _world_from(text) else "the launcher"
    assumptions = [f"world size {world} from {told} (torchrun sets it)."]
    fields = _read_degrees(args, world, unmapped, source=source)
    fields.update(_read_cp(args, fields["cp"], unmapped, assumptions), **read_experts(args, fields, _int))
    fields.update(_read_batch(args, fields["dp"], batch_size, assumptions))
    fields.update(_read_precision(args, unmapped))
    fields["recompute"] = _read_recompute(args, unmapped)
    fields["recompute_blocks"] = _read_recompute_blocks(args, fields)
    fields.update(_read_data_parallel(args, fields["dp"], unmapped))
    fields["offload"] = megatron_offload(args, fields["zero_stage"], unmapped)  # export/offload.py
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


def _script_flags(text: str) -> tuple[list[Word], int | None]:
    """The words holding Megatron's flags, and the world size the launcher states (module docstring)."""
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    if all(line.startswith("--") for line in lines) and not re.search(r"[\"'$`\\]", "\n".join(lines)):
        words = [word for line in lines for word in re.split(r"\s#", line, maxsplit=1)[0].split()]
        return [Word(word) for word in words], None
    commands = read_script(text)
    launches = [c for c in commands if _script_at(c) is not None]
    if launches:
        launch = next((c for c in reversed(launches) if "train" in c.words[_script_at(c)].text), launches[-1])
        at = _script_at(launch)
        return launch.words[at + 1 :], _launcher_world(launch.words[:at])
    for command in commands:
        first = command.words[0]
        if not first.text.startswith("--") and not first.unresolved:
            raise ExportError(
                f"'{first.text}' is neither a --flag nor a launch command: give Megatron-LM's flags, or a script "
                "whose command runs the training script (torchrun ... pretrain_gpt.py --flags)."
            )
    return [word for command in commands for word in command.words], None


def _script_at(command: Command) -> int | None:
    return next((i for i, w in enumerate(command.words) if w.text.endswith(".py")), None)


def _launcher_world(words: list[Word]) -> int | None:
    """Processes per node times nodes, where the launch command states both as numbers."""
    options: dict[str, str] = {}
    for i, word in enumerate(words):
        name, _, inline = word.text.partition("=")
        if name in PER_NODE + NODES:
            options[name] = inline or (words[i + 1].text if i + 1 < len(words) else "")
    per_node = next((options[n] for n in PER_NODE if n in options), None)
    nodes = next((options[n] for n in NODES if n in options), "1")
    if per_node is None or not per_node.isdigit() or not nodes.isdigit():
        return None
    return int(per_node) * int(nodes)


def _parse(words: list[Word]) -> tuple[dict[str, Any], list[str]]:
    """Flags and their values (True for a switch), and one sentence per flag autoplan does not read."""
    args: dict[str, Any] = {}
    unmapped: list[str] = []
    unknown: list[str] = []
    i = 0
    while i < len(words):
        word, i = words[i], i + 1
        if word.unresolved and not word.text.startswith("--"):
            unknown += [name for name in word.unresolved if name not in unknown]
            continue
        flag, inline, given = word.text.partition("=")
        if not flag.startswith("--"):
            raise ExportError(f"'{word.text}' is not a --flag or a flag's value.")
        values = [Word(given, word.unresolved)] if inline else []
        while not inline and i < len(words) and not words[i].text.startswith("--") and flag not in SWITCHES:
            values, i = values + [words[i]], i + 1
        _take(args, unmapped, flag, values)
    if unknown:
        unmapped.insert(
            0,
            f"{', '.join(unknown)}: the script does not assign {'it' if len(unknown) == 1 else 'them'}, so flags "
            "passed through them were not read; assign them in the script to have them priced.",
        )
    return args, unmapped


def _take(args: dict[str, Any], unmapped: list[str], flag: str, values: list[Word]) -> None:
    """One flag into ``args`` (read) or ``unmapped`` (not priced)."""
    if flag in SWITCHES:
        args[flag] = True
    elif flag in VALUED:
        if not values:
            raise ExportError(f"{flag} needs a value.")
        missing = [name for value in values for name in value.unresolved]
        if missing:
            raise ExportError(
                f"{flag} {' '.join(v.text for v in values)}: the script does not assign {', '.join(missing)}; "
                "assign it in the script or write the value."
            )
        texts = [value.text for value in values]
        args[flag] = texts if flag in LISTS else texts[0]
    else:
        shown = f"{flag} {' '.join(v.text for v in values)}".strip()
        unmapped.append(f"{shown}: not a setting autoplan prices; ignored.")


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


def _read_degrees(args: dict[str, Any], world: int, unmapped: list[str], *, source: str = "") -> dict[str, Any]:
    tp, pp = _int(args, "--tensor-model-parallel-size", 1), _int(args, "--pipeline-model-parallel-size", 1)
    cp, ep = _int(args, "--context-parallel-size", 1), _int(args, "--expert-model-parallel-size", 1)
    if world % (tp * pp * cp):
        raise ExportError(f"world size {world}{source} is not divisible by tp {tp} x pp {pp} x cp {cp}.")
    dp = world // (tp * pp * cp)
    virtual = _read_virtual(args, pp)
    given = [f"{flag} {args[flag]}" for flag in UNEVEN if flag in args]
    layout = args.get("--pipeline-model-parallel-layout")
    given += [f"--pipeline-model-parallel-layout {layout}"] if layout and len(set(_layout_chunks(layout))) > 1 else []
    if given and pp > 1:
        unmapped.append(f"{' '.join(given)}: uneven stages; autoplan reads a config with balanced stages.")
    sp = tp > 1 and "--sequence-parallel" in args
    return {
        "devices": world,
        "dp": dp,
        "tp": tp,
        "pp": pp,
        "cp": cp,
        "ep": ep,
        "schedule": "interleaved_1f1b" if virtual > 1 else "1f1b",
        "virtual_stages": virtual,
        "sequence_parallel": sp,
        "tp_comm_overlap": sp and "--tp-comm-overlap" in args,
    }


def _read_cp(args: dict[str, Any], cp: int, unmapped: list[str], assumptions: list[str]) -> dict[str, str]:
    """The cp variant of ``--cp-comm-type`` (:data:`CP_VARIANTS`; Megatron's default p2p). One type per
    layer is read as the most common; a2a+p2p (a2a within groups of ``--hierarchical-context-parallel-sizes``'s
    first size, p2p across them: Megatron asserts the sizes) as ring, the p2p that crosses the groups."""
    types = args.get("--cp-comm-type", ["p2p"])
    wrong = [t for t in types if t not in CP_VARIANTS]
    if wrong:
        raise ExportError(f"--cp-comm-type {' '.join(wrong)}: expected p2p, all_gather, a2a or a2a+p2p.")
    if "a2a+p2p" in types:
        _check_hierarchical(args, cp)
    if cp == 1:
        return {"cp_variant": "allgather"}
    if "--cp-comm-type" not in args:
        assumptions.append(f"--cp-comm-type not stated with --context-parallel-size {cp}: Megatron's default p2p.")
    common = max(dict.fromkeys(types), key=types.count)
    if len(set(types)) > 1:
        unmapped.append(
            f"--cp-comm-type {' '.join(types)}: autoplan prices one variant for every layer; read as {common}."
        )
    if common == "a2a+p2p":
        inner = args["--hierarchical-context-parallel-sizes"][0]
        unmapped.append(
            f"--cp-comm-type a2a+p2p (hierarchical: a2a within groups of {inner}, p2p across them): autoplan "
            "has no hierarchical variant; read as ring (p2p over all cp ranks)."
        )
    return {"cp_variant": CP_VARIANTS[common]}


def _check_hierarchical(args: dict[str, Any], cp: int) -> None:
    """Megatron's validate_args: a2a+p2p needs hierarchical sizes whose product is the cp size."""
    sizes = args.get("--hierarchical-context-parallel-sizes")
    if not sizes:
        raise ExportError("--cp-comm-type a2a+p2p needs --hierarchical-context-parallel-sizes (Megatron asserts it).")
    if not all(size.isdigit() for size in sizes) or math.prod(int(size) for size in sizes) != cp:
        raise ExportError(
            f"--hierarchical-context-parallel-sizes {' '.join(sizes)}: their product must be "
            f"--context-parallel-size {cp}."
        )


def _layout_chunks(layout: str) -> list[int]:
    """Transformer blocks per chunk of ``--pipeline-model-parallel-layout``, its ``(...)*n`` and
    ``x*n`` unrolled as Megatron does (PipelineParallelLayerLayout.parse_str_to_list)."""
    text = layout.replace(",", "")
    for pattern in (r"\(([^)]+)\)\*(\d+)", r"(.)\*(\d+)"):
        text = re.sub(pattern, lambda match: match.group(1) * int(match.group(2)), text)
    return [chunk.count("t") for chunk in text.split("|")]


def _read_virtual(args: dict[str, Any], pp: int) -> int:
    if pp == 1:
        return 1
    if "--pipeline-model-parallel-layout" in args:
        chunks = len(_layout_chunks(args["--pipeline-model-parallel-layout"]))
        if chunks % pp:
            raise ExportError(f"--pipeline-model-parallel-layout has {chunks} stages, not a multiple of pp {pp}.")
        return chunks // pp
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
    recipe = ""
    if "--fp8-format" in args:
        precision = "fp8"
        recipe = FP8_RECIPES.get(args.get("--fp8-recipe", "delayed"), "")
        if not recipe:
            unmapped.append(
                f"--fp8-recipe {args['--fp8-recipe']}: autoplan prices Transformer Engine's tensorwise (current) and "
                "delayed scaling; read as current scaling."
            )
            recipe = "te_current"
    if precision in ("bf16", "fp8"):
        reduce = "bf16" if "--grad-reduce-in-bf16" in args else "fp32"
    elif precision == "fp16":
        reduce = "fp32" if "--accumulate-allreduce-grads-in-fp32" in args else "fp16"
    else:
        reduce = "fp32"
    return {"precision": precision, "grad_reduce_dtype": reduce, "fp8_recipe": recipe, "runtime": "megatron"}


def _read_recompute(args: dict[str, Any], unmapped: list[str]) -> str:
    granularity = args.get("--recompute-granularity")
    if granularity is None:
        return "selective" if "--recompute-activations" in args else "none"
    if granularity not in ("full", "selective"):
        raise ExportError(f"--recompute-granularity {granularity}: expected full or selective.")
    if granularity == "full":
        method, count = args.get("--recompute-method", "uniform"), _int(args, "--recompute-num-layers", 1)
        if (method, count) != ("uniform", 1) and method != "block":  # block: _read_recompute_blocks
            unmapped.append(
                f"--recompute-method {method} --recompute-num-layers {count}: autoplan prices full recompute "
                "of every block; read as that."
            )
    return granularity


def _read_recompute_blocks(args: dict[str, Any], fields: dict[str, Any]) -> list[int]:
    """``--recompute-method block --recompute-num-layers k``: the first k layers of each pipeline chunk
    recompute (Plan.recompute_blocks, one count per chunk); [] (every block) when k covers a chunk."""
    if fields["recompute"] != "full" or args.get("--recompute-method") != "block":
        return []
    chunks, count = fields["pp"] * fields["virtual_stages"], _int(args, "--recompute-num-layers", 1)
    per_chunk = _int(args, "--num-layers", 0) // chunks
    return [] if per_chunk and count >= per_chunk else [min(count, per_chunk or count)] * chunks


def _read_data_parallel(args: dict[str, Any], dp: int, unmapped: list[str]) -> dict[str, Any]:
    zero = 1 if "--use-distributed-optimizer" in args and not (dp == 1 and "--optimizer-cpu-offload" in args) else 0
    if "--use-megatron-fsdp" in args or "--use-custom-fsdp" in args:
        strategy = args.get("--data-parallel-sharding-strategy", "no_shard")
        zero = {"no_shard": zero, "optim": 1, "optim_grads": 2, "optim_grads_params": 3}.get(strategy, zero)
    if "--use-torch-fsdp2" in args:
        zero = 2 if "--torch-fsdp2-no-reshard-after-forward" in args else 3
    overlap = "--overlap-grad-reduce" in args or zero >= 2
    if zero >= 2 and "--overlap-grad-reduce" not in args:
        unmapped.append("FSDP without --overlap-grad-reduce: autoplan prices FSDP's reduce-scatter under the backward.")
    unmapped += _param_gather_notes(args, zero, dp)
    param_gather = zero in (1, 2) and "--overlap-grad-reduce" in args and "--overlap-param-gather" in args
    out = {"zero_stage": zero, "overlap_grad_reduce": overlap, "overlap_param_gather": param_gather}
    return out | _read_replicas(args, zero, dp, unmapped)


def _read_replicas(args: dict[str, Any], zero: int, dp: int, unmapped: list[str]) -> dict[str, Any]:
    """--num-distributed-optimizer-instances R as HSDP's dp_replicate (types/hsdp.py): the distributed
    optimizer (or Megatron-FSDP) over dp / R ranks, all-reduced across R instances."""
    replicas = _int(args, "--num-distributed-optimizer-instances", 1)
    if replicas == 1:
        return {}
    plain = _int(args, "--context-parallel-size", 1) == 1 and _int(args, "--expert-model-parallel-size", 1) == 1
    if zero >= 1 and plain and dp % replicas == 0 and dp // replicas >= 2:
        return {"dp_replicate": replicas}
    unmapped.append(
        f"--num-distributed-optimizer-instances {replicas}: autoplan's HSDP needs a sharded optimizer over 2 or more "
        f"of the {dp} data-parallel ranks per instance, without context or expert parallelism; read as one instance."
    )
    return {}


def _param_gather_notes(args: dict[str, Any], zero: int, dp: int) -> list[str]:
    """Where the config's weight all-gather is not priced as Megatron runs it (docs/export-megatron.md):
    --overlap-param-gather that Megatron-LM refuses (without the distributed optimizer or FSDP, or
    without --overlap-grad-reduce), and Megatron-FSDP ZeRO-3 without it (priced prefetched)."""
    overlapped = "--overlap-param-gather" in args
    if overlapped and (zero == 0 or "--overlap-grad-reduce" not in args) and zero < 2:
        return [
            "--overlap-param-gather needs --use-distributed-optimizer and --overlap-grad-reduce (Megatron-LM "
            "refuses it otherwise); read without it."
        ]
    if zero == 3 and dp > 1 and not overlapped and "--use-torch-fsdp2" not in args:
        return [
            "Megatron-FSDP without --overlap-param-gather gathers each block's weights when it is needed; "
            "autoplan prices them prefetched one block ahead, so the config may run slower than priced."
        ]
    return []
