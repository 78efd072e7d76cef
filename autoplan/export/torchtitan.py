"""A plan as torchtitan 0.2.2's TOML ``JobConfig``, and such a TOML read back (docs/export-torchtitan.md).

torchtitan 0.2.2 is the last release that reads TOML (``--job.config_file``); 0.3.0 takes Python
config functions. Plan field → TOML key (``[section] key``):

======================== =========================================================================
plan                     torchtitan 0.2.2
======================== =========================================================================
dp, zero_stage 3         ``[parallelism] data_parallel_shard_degree = dp``, ``fsdp_reshard_after_forward = "always"``
dp, zero_stage 2         the same with ``"never"`` (gradients and optimizer states sharded, parameters kept)
dp, zero_stage 1         no equivalent: written as ZeRO-2 (``"never"``), named in ``unexpressed``
dp, zero_stage 0         ``data_parallel_replicate_degree = dp`` (torchtitan's DDP) when tp = pp = ep = 1;
                         torchtitan runs DDP only without other parallelism, so otherwise as ZeRO-2, named
tp                       ``tensor_parallel_degree`` (0.2.2 always adds sequence parallelism to TP)
tp_comm_overlap          ``enable_async_tensor_parallel = true`` and ``[compile] enable`` (async TP needs compile)
pp, schedule             ``pipeline_parallel_degree``, ``pipeline_parallel_schedule`` GPipe | 1F1B | Interleaved1F1B
stages                   ``pipeline_parallel_layers_per_stage = m`` (the middle chunks' blocks) and
                         ``pipeline_parallel_first/last_stage_less_layers`` = m minus the first/last chunk's:
                         torchtitan builds ceil((layers + both) / m) = pp·v chunks, embedding on the first
micro_batch_size, n      pp > 1: ``local_batch_size = mbs·n``, ``pipeline_parallel_microbatch_size = mbs``;
                         pp = 1: ``local_batch_size = mbs`` and gradient accumulation
                         ``global_batch_size / (local_batch_size·dp) = n``
global batch             ``[training] global_batch_size = dp·mbs·n``; ``seq_len`` from the trace
precision                fp32 → ``mixed_precision_param = "float32"``; bf16 → ``"bfloat16"``; fp8 → bf16 and
                         ``[model] converters = ["quantize.linear.float8"]``, ``[quantize.linear.float8]
                         recipe_name = "tensorwise"``; fp16 has no switch (written as bf16, named)
grad_reduce_dtype        ``mixed_precision_reduce = "float32"``, the only value 0.2.2 takes; bf16/fp16 named
recompute                ``[activation_checkpoint] mode`` none | selective (``selective_ac_option = "op"``,
                         op-level SAC, as autoplan prices it) | full
ep                       ``expert_parallel_degree``
======================== =========================================================================

Also named in ``unexpressed``: PowerSGD, a reduction after the backward (torchtitan's FSDP and DDP
overlap it), uneven pipeline stages, TP without sequence parallelism, a per-op ``tp_plan``
(:func:`split_note`), and mixed precision where torchtitan turns it off (TP or PP without FSDP).

:func:`read` inverts the table: ``devices = replicate·shard·cp·tp·pp``, ``dp = replicate·shard``,
ZeRO from the reshard policy (``"default"`` is ZeRO-3 without PP, ZeRO-2 with it, as torchtitan
resolves it), ``n = global / (dp·mbs)``, and ``v`` from ``module_fqns_per_model_part`` or from
``layers_per_stage`` and the layer count that the exporter writes into ``[job] description``.
Context parallelism, HSDP, CPU offload and other schedules are listed in ``unmapped``.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

import tomllib

from autoplan.export.common import Exported, ExportError, Imported, ModelFacts, comment_lines, split_note
from autoplan.types.plan import Plan

SCHEDULES = {"gpipe": "GPipe", "1f1b": "1F1B", "interleaved_1f1b": "Interleaved1F1B"}
MULTI_STAGE = ("interleaved1f1b", "loopedbfs", "interleavedzerobubble", "zbvzerobubble", "dualpipev")
GPUS_PER_NODE = 8  # a plan does not say how its devices sit in nodes; the launch line assumes 8
FLOAT8 = "quantize.linear.float8"
FILENAME = "torchtitan.toml"
#: torchtitan 0.2.2's defaults (``JobConfig``) for keys that set a price: (section, key, value).
DEFAULTS = (("training", "mixed_precision_param", "bfloat16"), ("activation_checkpoint", "mode", "selective"),
            ("training", "local_batch_size", 8))  # fmt: skip


# ---- export ------------------------------------------------------------------------------------
def export(plan: Plan, facts: ModelFacts) -> Exported:
    """The plan as torchtitan 0.2.2 TOML (module docstring); what it cannot say is in ``unexpressed``."""
    notes: list[str] = []
    remarks: list[str] = []
    layers = f", {facts.layers} layers" if facts.layers else ""  # read() takes v from this layer count
    sections: dict[str, dict[str, Any]] = {
        "job": {"description": f"autoplan plan for {facts.name}{layers}: {plan.describe()}"},
        "model": _model(plan, facts, remarks),
        "training": _training(plan, facts, notes, remarks),
        "parallelism": _parallelism(plan, facts, notes),
        "activation_checkpoint": {"mode": plan.recompute},
    }
    if plan.recompute == "selective":  # op-level SAC, as autoplan prices selective
        sections["activation_checkpoint"]["selective_ac_option"] = "op"
    if plan.tp_comm_overlap:
        sections["compile"] = {"enable": True, "components": ["model", "loss"]}
    if plan.precision == "fp8":
        sections["quantize.linear.float8"] = {"recipe_name": "tensorwise"}
    notes += _general_notes(plan)
    launch = _launch(plan.devices)
    header = [f"torchtitan 0.2.2 JobConfig written by autoplan for: {plan.describe()}", f"launch: {launch}"]
    if plan.devices > GPUS_PER_NODE:
        header.append(f"({GPUS_PER_NODE} GPUs per node assumed: --nnodes x --nproc-per-node must be {plan.devices})")
    text = _render(sections, header=header, notes=notes, remarks=remarks)
    return Exported(framework="torchtitan", filename=FILENAME, text=text, unexpressed=notes, launch=launch)


def _model(plan: Plan, facts: ModelFacts, remarks: list[str]) -> dict[str, Any]:
    sizes = {"layers": facts.layers, "hidden": facts.hidden_size, "heads": facts.num_heads}
    sizes.update({"KV heads": facts.num_kv_heads, "vocab": facts.vocab_size})
    known = ", ".join(f"{k} {v}" for k, v in sizes.items() if v)
    remarks.append(
        f"[model] name and flavor: torchtitan trains a model from its own registry (e.g. llama3 / 8B); "
        f"set the one that matches '{facts.name}'" + (f" ({known})." if known else ".")
    )
    return {"converters": [FLOAT8]} if plan.precision == "fp8" else {}


def _training(plan: Plan, facts: ModelFacts, notes: list[str], remarks: list[str]) -> dict[str, Any]:
    local = plan.micro_batch_size * plan.num_microbatches if plan.pp > 1 else plan.micro_batch_size
    out: dict[str, Any] = {"local_batch_size": local, "global_batch_size": plan.global_batch_size}
    if facts.seq_len:
        out["seq_len"] = facts.seq_len
    else:
        remarks.append("[training] seq_len: the trace does not state the sequence length; set it.")
    out["mixed_precision_param"] = "float32" if plan.precision == "fp32" else "bfloat16"
    out["mixed_precision_reduce"] = "float32"
    if plan.precision == "fp16":
        notes.append("fp16 training: torchtitan has no fp16 mixed precision; written as bf16.")
    if plan.grad_reduce_dtype != "fp32":
        notes.append(
            f"gradient reduction in {plan.grad_reduce_dtype}: torchtitan 0.2.2 reduces in float32 only "
            "(mixed_precision_reduce), so it sends twice the bytes autoplan priced."
        )
    if plan.precision != "fp32" and (plan.tp > 1 or plan.pp > 1) and plan.dp == 1:
        notes.append(
            f"{plan.precision} with TP or PP and no data parallelism: torchtitan applies mixed precision through "
            "FSDP or AMP only, and turns it off with TP or PP without FSDP, so this runs in float32."
        )
    return out


def _parallelism(plan: Plan, facts: ModelFacts, notes: list[str]) -> dict[str, Any]:
    out = _data_parallel(plan, notes)
    out["tensor_parallel_degree"] = plan.tp
    if plan.tp > 1 and not plan.sequence_parallel:
        notes.append(
            "TP without sequence parallelism: torchtitan 0.2.2 always shards norms and activations along the "
            "sequence with TP, so it runs sequence parallelism, which autoplan did not price."
        )
    if plan.tp_comm_overlap:
        out["enable_async_tensor_parallel"] = True
    out["context_parallel_degree"] = 1
    out["expert_parallel_degree"] = plan.ep
    if plan.pp > 1:
        out.update(_pipeline(plan, facts, notes))
    return out


def _data_parallel(plan: Plan, notes: list[str]) -> dict[str, Any]:
    if plan.dp == 1 or (plan.zero_stage == 0 and plan.tp == plan.pp == plan.ep == 1):
        return {"data_parallel_replicate_degree": plan.dp, "data_parallel_shard_degree": 1}  # DDP
    if plan.zero_stage < 2:
        what = (
            "ZeRO-1 (only optimizer states sharded) has no torchtitan equivalent"
            if plan.zero_stage == 1
            else "ZeRO-0 with TP, PP or EP: torchtitan runs DDP only without other parallelism"
        )
        notes.append(f"{what}; written as FSDP without resharding after forward (ZeRO-2-like), which shards gradients.")
    reshard = "always" if plan.zero_stage == 3 else "never"
    return {"data_parallel_shard_degree": plan.dp, "fsdp_reshard_after_forward": reshard}


def _pipeline(plan: Plan, facts: ModelFacts, notes: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {
        "pipeline_parallel_degree": plan.pp,
        "pipeline_parallel_schedule": SCHEDULES[plan.schedule],
        "pipeline_parallel_microbatch_size": plan.micro_batch_size,
    }
    weights = _chunk_weights(plan, facts)
    if weights is None:
        notes.append(
            f"pipeline stages: autoplan's {plan.pp * plan.virtual_stages} chunks are unknown, or their middle chunks "
            "differ in size; torchtitan splits the layers by its own balance (module_fqns_per_model_part can "
            "list them by hand)."
        )
        return out
    out["pipeline_parallel_layers_per_stage"], first_less, last_less = weights
    out["pipeline_parallel_first_stage_less_layers"] = first_less
    out["pipeline_parallel_last_stage_less_layers"] = last_less
    return out


def _chunk_weights(plan: Plan, facts: ModelFacts) -> tuple[int, int, int] | None:
    """(layers per chunk m, first-chunk deficit, last-chunk deficit), or None. torchtitan gives every chunk m
    "effective layers" of layers + deficits, the first m - first and the last m - last, so the middle chunks
    must be equal and the end chunks no larger."""
    chunks = plan.pp * plan.virtual_stages
    if plan.stages:
        sizes = [len(stage) for stage in plan.stages]
    elif facts.layers and facts.layers % chunks == 0:
        sizes = [facts.layers // chunks] * chunks
    else:
        return None
    middle = sizes[1:-1]
    m = middle[0] if middle else max(sizes)
    if m < 1 or any(size != m for size in middle) or max(sizes[0], sizes[-1]) > m:
        return None
    return m, m - sizes[0], m - sizes[-1]


def _general_notes(plan: Plan) -> list[str]:
    notes = []
    if plan.grad_compression == "powersgd":
        notes.append(f"PowerSGD rank {plan.powersgd_rank}: torchtitan has no gradient compression.")
    if not plan.overlap_grad_reduce and plan.dp > 1:
        notes.append("gradient reduction after the backward: torchtitan's FSDP and DDP always overlap it.")
    note = split_note(plan)
    if note:
        notes.append(note)
    return notes


def _launch(devices: int) -> str:
    per_node = max(g for g in range(1, GPUS_PER_NODE + 1) if devices % g == 0)
    nodes = devices // per_node
    rdzv = " --rdzv-backend c10d --rdzv-endpoint $HEAD_NODE:29500" if nodes > 1 else ""
    return (
        f"torchrun --nnodes {nodes} --nproc-per-node {per_node}{rdzv} -m torchtitan.train --job.config_file {FILENAME}"
    )


def _render(sections: dict[str, dict[str, Any]], *, header: list[str], notes: list[str], remarks: list[str]) -> str:
    lines = [f"# {h}" for h in header]
    lines += comment_lines("torchtitan", notes=notes, remarks=remarks)
    for name, table in ((n, t) for n, t in sections.items() if t):
        lines += ["", f"[{name}]"]
        lines += [f"{key} = {_toml_value(value)}" for key, value in table.items()]
    return "\n".join(lines) + "\n"


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return json.dumps(value)  # ints, and strings as TOML basic strings


# ---- read --------------------------------------------------------------------------------------
def read(text: str, *, devices: int | None = None, batch_size: int | None = None) -> Imported:
    """A torchtitan 0.2.2 TOML read back into Plan fields (module docstring); ``batch_size``: an unset global batch."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ExportError(f"not valid TOML: {exc}.") from None
    par, training = data.get("parallelism", {}), data.get("training", {})
    unmapped: list[str] = []
    degrees = _read_degrees(par, devices, unmapped)
    assumptions = _defaults_used(data, degrees["dp"], batch_size)
    if batch_size and training.get("global_batch_size", -1) < 0:
        training = {**training, "global_batch_size": batch_size}
    layers = _layers_from(data)
    fields = {**degrees, **_read_batch(par, training, degrees, unmapped)}
    fields.update(_read_pipeline(par, degrees["pp"], layers, unmapped))
    fields.update(_read_precision(data, degrees, unmapped))
    fields["recompute"] = _read_recompute(data.get("activation_checkpoint", {}), unmapped)
    fields["sequence_parallel"] = degrees["tp"] > 1
    fields["tp_comm_overlap"] = degrees["tp"] > 1 and bool(par.get("enable_async_tensor_parallel", False))
    if training.get("enable_cpu_offload"):
        unmapped.append("enable_cpu_offload: autoplan does not price CPU offload.")
    facts = ModelFacts(layers=layers, seq_len=training.get("seq_len"))
    return Imported(framework="torchtitan", fields=fields, unmapped=unmapped, facts=facts, assumptions=assumptions)


def _defaults_used(data: dict[str, Any], dp: int, batch_size: int | None) -> list[str]:
    """The defaults (:data:`DEFAULTS`) and --devices/--batch values used for keys the file leaves out."""
    training = data.get("training", {})
    found = [f"{s}.{k} not stated: torchtitan's default {v!r}." for s, k, v in DEFAULTS if k not in data.get(s, {})]
    if data.get("parallelism", {}).get("data_parallel_shard_degree", -1) == -1:
        found.append(f"data_parallel_shard_degree -1 (torchtitan's default): the ranks --devices leaves, dp {dp}.")
    if training.get("global_batch_size", -1) < 0:
        local = training.get("local_batch_size", 8)
        how = f"{batch_size} from --batch" if batch_size else f"local_batch_size {local} x dp {dp} (no accumulation)"
        found.append(f"training.global_batch_size not stated: read as {how}.")
    flavor = data.get("model", {}).get("flavor")
    return found + ([f"model.flavor {flavor!r}: its sizes are not compared with the model's."] if flavor else [])


def _read_degrees(par: dict[str, Any], devices: int | None, unmapped: list[str]) -> dict[str, Any]:
    replicate, shard = par.get("data_parallel_replicate_degree", 1), par.get("data_parallel_shard_degree", -1)
    tp, pp = par.get("tensor_parallel_degree", 1), par.get("pipeline_parallel_degree", 1)
    cp = par.get("context_parallel_degree", 1)
    if shard == -1:
        if devices is None:
            raise ExportError(
                "data_parallel_shard_degree = -1 takes the leftover ranks; pass the world size (devices)."
            )
        shard = devices // (replicate * cp * tp * pp)
    world = replicate * shard * cp * tp * pp
    if devices is not None and world != devices:
        raise ExportError(
            f"replicate {replicate} x shard {shard} x cp {cp} x tp {tp} x pp {pp} = {world}, "
            f"not the {devices} devices given."
        )
    if cp > 1:
        unmapped.append(f"context_parallel_degree = {cp}: autoplan does not price context parallelism.")
    if replicate > 1 and shard > 1:
        unmapped.append(
            f"HSDP (replicate {replicate} x shard {shard}): autoplan prices ZeRO over all "
            f"{replicate * shard} data-parallel ranks."
        )
    zero = _read_zero(par.get("fsdp_reshard_after_forward", "default"), shard, pp)
    ep = par.get("expert_parallel_degree", 1)
    return dict(devices=replicate * shard * tp * pp, dp=replicate * shard, tp=tp, pp=pp, ep=ep, zero_stage=zero)


def _read_zero(reshard: str, shard: int, pp: int) -> int:
    if shard == 1:
        return 0
    if reshard == "default":  # torchtitan: reshard after forward unless PP is on
        return 2 if pp > 1 else 3
    return 3 if reshard == "always" else 2


def _read_batch(
    par: dict[str, Any], training: dict[str, Any], degrees: dict[str, Any], unmapped: list[str]
) -> dict[str, Any]:
    dp, local = degrees["dp"], training.get("local_batch_size", 8)
    global_batch = training.get("global_batch_size", -1)
    global_batch = local * dp if global_batch < 0 else global_batch
    if global_batch % (local * dp):
        raise ExportError(f"global_batch_size {global_batch} is not a multiple of local_batch_size {local} x dp {dp}.")
    mbs = par.get("pipeline_parallel_microbatch_size", 1) if degrees["pp"] > 1 else local
    if local % mbs:
        raise ExportError(f"local_batch_size {local} is not a multiple of pipeline_parallel_microbatch_size {mbs}.")
    accumulation = global_batch // (local * dp)
    if degrees["pp"] > 1 and accumulation > 1:
        unmapped.append(
            f"{accumulation} gradient-accumulation steps with PP: torchtitan runs the pipeline {accumulation} "
            f"times per step; autoplan prices one pipeline of {global_batch // (dp * mbs)} micro-batches."
        )
    return {"micro_batch_size": mbs, "num_microbatches": global_batch // (dp * mbs)}


def _read_pipeline(par: dict[str, Any], pp: int, layers: int | None, unmapped: list[str]) -> dict[str, Any]:
    if pp == 1:
        return {"schedule": "1f1b", "virtual_stages": 1}
    name = str(par.get("pipeline_parallel_schedule", "1F1B"))
    multi = name.lower() in MULTI_STAGE
    schedule = {v.lower(): k for k, v in SCHEDULES.items()}.get(name.lower())
    if schedule is None:
        schedule = "interleaved_1f1b" if multi else "1f1b"
        unmapped.append(f"pipeline schedule {name}: autoplan has no term for it; read as {schedule}.")
    chunks = _chunks(par, pp, multi, layers, unmapped)
    virtual = max(chunks // pp, 1) if schedule == "interleaved_1f1b" else 1
    return {"schedule": schedule, "virtual_stages": virtual}


def _chunks(par: dict[str, Any], pp: int, multi: bool, layers: int | None, unmapped: list[str]) -> int:
    if par.get("module_fqns_per_model_part"):
        return len(par["module_fqns_per_model_part"])
    per_chunk = par.get("pipeline_parallel_layers_per_stage")
    if per_chunk is None:
        return pp * (2 if multi else 1)  # torchtitan's default stages per rank
    if layers is None:
        unmapped.append(
            "pipeline_parallel_layers_per_stage without a layer count: torchtitan takes it from the model; "
            "read as 2 chunks per stage."
        )
        return pp * (2 if multi else 1)
    first = par.get("pipeline_parallel_first_stage_less_layers", 1)
    last = par.get("pipeline_parallel_last_stage_less_layers", 1)
    if first or last:
        unmapped.append(f"first/last chunk {first}/{last} blocks short: autoplan reads balanced stages.")
    return math.ceil((layers + first + last) / per_chunk)


def _layers_from(data: dict[str, Any]) -> int | None:
    match = re.search(r"(\d+) layers", str(data.get("job", {}).get("description", "")))
    return int(match.group(1)) if match else None


def _read_precision(data: dict[str, Any], degrees: dict[str, Any], unmapped: list[str]) -> dict[str, Any]:
    training = data.get("training", {})
    param = training.get("mixed_precision_param", "bfloat16")
    fsdp = degrees["dp"] > 1 and degrees["zero_stage"] > 0
    precision = "bf16" if param == "bfloat16" else "fp32"
    if precision == "bf16" and not fsdp and (degrees["tp"] > 1 or degrees["pp"] > 1):
        unmapped.append("mixed precision with TP or PP but no FSDP: torchtitan turns it off; read as fp32.")
        precision = "fp32"
    if training.get("dtype") == "bfloat16":
        unmapped.append("training.dtype = bfloat16 (no fp32 master weights): read as bf16 mixed precision.")
        precision = "bf16"
    converters = data.get("model", {}).get("converters", [])
    if FLOAT8 in converters or "float8" in converters:
        precision = "fp8"
        recipe = data.get("quantize", {}).get("linear", {}).get("float8", {}).get("recipe_name")
        if recipe not in (None, "tensorwise"):
            unmapped.append(f"float8 recipe {recipe}: autoplan prices tensorwise scaling.")
    return {"precision": precision, "grad_reduce_dtype": "fp32"}


def _read_recompute(ac: dict[str, Any], unmapped: list[str]) -> str:
    mode = ac.get("mode", "selective")
    if mode == "memory_budget":
        unmapped.append("activation_checkpoint mode memory_budget: autoplan does not price it; read as selective.")
        return "selective"
    option = str(ac.get("selective_ac_option", "2"))
    if mode == "selective" and option != "op":
        if option == "1":
            return "full"
        unmapped.append(f"selective_ac_option = {option} (full AC on every {option}th block): read as selective.")
    return mode
