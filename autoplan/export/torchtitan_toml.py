"""A plan as torchtitan 0.2.x's TOML ``JobConfig`` (``autoplan export --to torchtitan --format toml``),
and such a TOML read back (the plan-field-to-key table and what 0.2.x cannot express:
docs/export-torchtitan.md, "The 0.2.x TOML mapping").

torchtitan 0.2.2 is the last release that reads TOML (``--job.config_file``); 0.3 takes Python
config functions (autoplan/export/torchtitan_py.py). :func:`read` inverts the table:
``devices = replicate·shard·cp·tp·pp``, ``dp = replicate·shard``, ZeRO from the reshard policy
(``"default"`` is ZeRO-3 without PP, ZeRO-2 with it, as torchtitan resolves it), ``n = global /
(dp·mbs)``, and ``v`` from ``module_fqns_per_model_part`` or from ``layers_per_stage`` and the layer
count the exporter writes into ``[job] description``. ``context_parallel_degree`` is the plan's cp
(its ``dp_shard x cp`` ranks are FSDP's, so ZeRO comes from the reshard policy whenever cp > 1),
read as allgather: 0.2.2 trains with torch's default rotation. HSDP, CPU offload, other load
balancers and other schedules are listed in ``unmapped``.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

import tomllib

from autoplan.export.common import Exported, ExportError, Imported, ModelFacts, comment_lines, frozen_notes
from autoplan.export.offload import torchtitan_offload, torchtitan_training
from autoplan.export.recompute_budget import (
    layer_sac_option,
    read_torchtitan_ac,
    torchtitan_chunk_sizes,
    torchtitan_toml_note,
)
from autoplan.export.torchtitan import (
    MULTI_STAGE,
    chunk_modules,
    chunk_sizes,
    context_parallel,
    general_notes,
    launch,
    nodes_note,
    pick_flavour,
    pipeline_schedule,
    precision_notes,
    schedule_named,
    training_batch,
)
from autoplan.export.torchtitan_flavours import Registry
from autoplan.types.hsdp import dp_shard
from autoplan.types.plan import Plan

FLOAT8 = "quantize.linear.float8"
FILENAME = "torchtitan.toml"
# 0.2.x's names for the modules before the first and after the last block, where its registry is not installed
END_MODULES_02 = (["tok_embeddings"], ["norm", "output"])
#: torchtitan's defaults (0.2.2's ``JobConfig``) for keys that set a price: (section, key, value).
DEFAULTS = (("training", "mixed_precision_param", "bfloat16"), ("activation_checkpoint", "mode", "selective"),
            ("training", "local_batch_size", 8))  # fmt: skip


# ---- export ------------------------------------------------------------------------------------
def export(plan: Plan, facts: ModelFacts, *, registry: Registry) -> Exported:
    """The plan as torchtitan 0.2.x TOML (module docstring); what it cannot say is in ``unexpressed``."""
    notes: list[str] = []
    remarks: list[str] = []
    layers = f", {facts.layers} layers" if facts.layers else ""  # read() takes v from this layer count
    sections: dict[str, dict[str, Any]] = {
        "job": {"description": f"autoplan plan for {facts.name}{layers}: {plan.describe()}"},
        "model": _model(plan, facts, registry, notes),
        "training": _training(plan, facts, notes, remarks),
        "parallelism": _parallelism(plan, facts, registry, notes),
        "activation_checkpoint": {"mode": plan.recompute},
    }
    if plan.recompute == "selective":  # op-level SAC, as autoplan prices selective
        sections["activation_checkpoint"]["selective_ac_option"] = "op"
    if plan.recompute_blocks:  # k of a stage's blocks: every N-th when one N gives the counts (recompute_budget.py)
        every = layer_sac_option(plan, chunk_sizes(plan, facts, []))
        if every is not None:
            sections["activation_checkpoint"] = {"mode": "selective", "selective_ac_option": str(every)}
        notes.append(torchtitan_toml_note(plan, every))
    if plan.compile or plan.tp_comm_overlap or plan.precision == "fp8":  # the plan's compile; async TP needs it;
        sections["compile"] = {"enable": True, "components": ["model", "loss"]}  # float8 is slow without it
    if plan.precision == "fp8":
        sections["quantize.linear.float8"] = {"recipe_name": "tensorwise"}
    notes += general_notes(plan) + frozen_notes(facts, "torchtitan")
    command = launch(plan.devices, f"--job.config_file {FILENAME}")
    header = [f"torchtitan 0.2.x JobConfig written by autoplan for: {plan.describe()}", f"launch: {command}"]
    text = _render(sections, header=header + nodes_note(plan.devices), notes=notes, remarks=remarks)
    return Exported(framework="torchtitan", filename=FILENAME, text=text, unexpressed=notes, launch=command)


def _model(plan: Plan, facts: ModelFacts, registry: Registry, notes: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    flavour, why = pick_flavour(registry, facts, "toml")
    if flavour is not None:
        out = {"name": flavour.module, "flavor": flavour.flavor}
    else:
        notes.append(f"{why} ([model] name and flavor: unset, torchtitan trains its llama3 debugmodel.)")
    if plan.precision == "fp8":
        out["converters"] = [FLOAT8]
    return out


def _training(plan: Plan, facts: ModelFacts, notes: list[str], remarks: list[str]) -> dict[str, Any]:
    out = training_batch(plan, facts, remarks, seq_len_key="[training] seq_len") | torchtitan_training(plan, notes)
    notes += precision_notes(plan, series="0.2.x")
    if plan.precision != "fp32" and (plan.tp > 1 or plan.pp > 1) and plan.dp == plan.cp == 1:
        notes.append(
            f"{plan.precision} with TP or PP and no data parallelism: torchtitan applies mixed precision through "
            "FSDP or AMP only, and turns it off with TP or PP without FSDP, so this runs in float32."
        )
    return out


def _parallelism(plan: Plan, facts: ModelFacts, registry: Registry, notes: list[str]) -> dict[str, Any]:
    out = _data_parallel(plan, notes)
    out["tensor_parallel_degree"] = plan.tp
    if plan.tp > 1 and not plan.sequence_parallel:
        notes.append(
            "TP without sequence parallelism: torchtitan 0.2.x always shards norms and activations along the "
            "sequence with TP, so it runs sequence parallelism, which autoplan did not price."
        )
    if plan.tp_comm_overlap:
        out["enable_async_tensor_parallel"] = True
    out.update(context_parallel(plan, facts, notes, series="0.2.x"))
    out["expert_parallel_degree"] = plan.ep
    if plan.pp > 1:
        out.update(_pipeline(plan, facts, registry, notes))
    return out


def _data_parallel(plan: Plan, notes: list[str]) -> dict[str, Any]:
    if plan.cp == 1 and (plan.dp == 1 or (plan.zero_stage == 0 and plan.tp == plan.pp == plan.ep == 1)):
        return {"data_parallel_replicate_degree": plan.dp, "data_parallel_shard_degree": 1}  # DDP
    if plan.zero_stage < 2 and plan.cp == 1:  # with cp, context_parallel() says it
        what = (
            "ZeRO-1 (only optimizer states sharded) has no torchtitan equivalent"
            if plan.zero_stage == 1
            else "ZeRO-0 with TP, PP or EP: torchtitan 0.2.x runs DDP only without other parallelism"
        )
        notes.append(f"{what}; written as FSDP without resharding after forward (ZeRO-2-like), which shards gradients.")
    reshard = "always" if plan.zero_stage == 3 else "never"
    out = {"data_parallel_shard_degree": dp_shard(plan), "fsdp_reshard_after_forward": reshard}
    return {"data_parallel_replicate_degree": plan.dp_replicate, **out} if plan.dp_replicate > 1 else out  # HSDP


def _pipeline(plan: Plan, facts: ModelFacts, registry: Registry, notes: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {
        "pipeline_parallel_degree": plan.pp,
        "pipeline_parallel_schedule": pipeline_schedule(plan, notes),
        "pipeline_parallel_microbatch_size": plan.micro_batch_size,
    }
    sizes = chunk_sizes(plan, facts, notes)
    if sizes is None:
        return out
    weights = _chunk_weights(sizes)
    if weights is None:  # the middle chunks differ: only explicit module lists say it
        ends = registry.version.startswith("0.2") and registry.input_modules
        first, last = (registry.input_modules, registry.output_modules) if ends else (END_MODULES_02)
        out["module_fqns_per_model_part"] = chunk_modules(sizes, first, last)
        return out
    out["pipeline_parallel_layers_per_stage"], first_less, last_less = weights
    out["pipeline_parallel_first_stage_less_layers"] = first_less
    out["pipeline_parallel_last_stage_less_layers"] = last_less
    return out


def _chunk_weights(sizes: list[int]) -> tuple[int, int, int] | None:
    """(layers per chunk m, first-chunk deficit, last-chunk deficit), or None. torchtitan gives every chunk m
    "effective layers" of layers + deficits, the first m - first and the last m - last, so the middle chunks
    must be equal and the end chunks no larger."""
    middle = sizes[1:-1]
    m = middle[0] if middle else max(sizes)
    if m < 1 or any(size != m for size in middle) or max(sizes[0], sizes[-1]) > m:
        return None
    return m, m - sizes[0], m - sizes[-1]


def _render(sections: dict[str, dict[str, Any]], *, header: list[str], notes: list[str], remarks: list[str]) -> str:
    lines = [f"# {h}" for h in header]
    lines += comment_lines("torchtitan", notes=notes, remarks=remarks)
    for name, table in ((n, t) for n, t in sections.items() if t):
        lines += ["", f"[{name}]"]
        lines += [f"{key} = {_toml_value(value)}" for key, value in table.items()]
    return "\n".join(lines) + "\n"


def _toml_value(value: Any) -> str:
    if isinstance(value, list) and value and all(isinstance(v, list) for v in value):  # chunks: one a line
        return "[\n" + "".join(f"    {_toml_value(v)},\n" for v in value) + "]"
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
    return read_data(data, devices=devices, batch_size=batch_size)


def read_data(
    data: dict[str, Any], *, devices: int | None = None, series: str = "0.2", batch_size: int | None = None
) -> Imported:
    """torchtitan's settings (``{section: {key: value}}``, TOML's layout) as Plan fields; ``series`` "0.3"
    wraps every model in FSDP, so mixed precision stays on with TP or PP alone."""
    par, training = data.get("parallelism", {}), data.get("training", {})
    unmapped: list[str] = []
    degrees = _read_degrees(par, devices, unmapped)
    assumptions = _defaults_used(data, degrees["dp"], batch_size)
    if batch_size and training.get("global_batch_size", -1) < 0:
        training = {**training, "global_batch_size": batch_size}
    layers = _layers_from(data)
    fields = {**degrees, **_read_batch(par, training, degrees, unmapped)}
    fields.update(_read_pipeline(par, degrees["pp"], layers, unmapped))
    fields.update(_read_precision(data, degrees, unmapped, fsdp_always=series != "0.2"))
    fields["cp_variant"] = _read_cp(data, degrees, training.get("seq_len"), unmapped, series=series)
    chunks = degrees["pp"] * fields["virtual_stages"]
    sizes = torchtitan_chunk_sizes(par, chunks, layers)
    fields.update(read_torchtitan_ac(data.get("activation_checkpoint", {}), sizes, unmapped))
    fields["sequence_parallel"] = degrees["tp"] > 1 and par.get("enable_sequence_parallel", True)  # 0.3 has the key
    fields["tp_comm_overlap"] = degrees["tp"] > 1 and bool(par.get("enable_async_tensor_parallel", False))
    fields["compile"] = bool(data.get("compile", {}).get("enable", False))  # per TransformerBlock, as Plan.compile
    fields["offload"] = torchtitan_offload(training, fields, pp=degrees["pp"], unmapped=unmapped)  # CPUOffloadPolicy
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
    zero = _read_zero(par.get("fsdp_reshard_after_forward", "default"), shard * cp, pp)  # FSDP over shard x cp
    ep = par.get("expert_parallel_degree", 1)
    hsdp = replicate > 1 and shard * cp > 1
    if hsdp and ep > 1:
        unmapped.append(
            f"HSDP (replicate {replicate} x shard {shard} x cp {cp}, ep {ep}): autoplan's HSDP composes with tp, "
            f"pp and cp only, so it prices ZeRO over all {replicate * shard * cp} dp x cp ranks."
        )
    replicas = (
        replicate if hsdp and ep == 1 else 1
    )  # HSDP read as dp_replicate, sharded over shard x cp (types/hsdp.py)
    degrees = dict(devices=world, dp=replicate * shard, tp=tp, pp=pp, cp=cp, ep=ep, zero_stage=zero)
    return {**degrees, "dp_replicate": replicas} if replicas > 1 else degrees


def _read_cp(
    data: dict[str, Any], degrees: dict[str, Any], seq_len: int | None, unmapped: list[str], *, series: str
) -> str:
    """The cp variant torchtitan trains with: allgather, its one (torchtitan.context_parallel's docstring);
    a rotate setting that does not reach training, a load balancer other than head-tail, and a sequence
    the trainer refuses are said or refused."""
    par, cp = data.get("parallelism", {}), degrees["cp"]
    if cp == 1:
        return "allgather"
    tp = degrees["tp"] if par.get("enable_sequence_parallel", True) else 1
    if seq_len and seq_len % (2 * cp * tp):
        raise ExportError(
            f"seq_len {seq_len} is not divisible by {2 * cp * tp} (2 x cp {cp} x tp {tp}): torchtitan refuses it."
        )
    balancer = par.get("context_parallel_load_balancer", "headtail")
    if balancer != "headtail":
        unmapped.append(
            f"context_parallel_load_balancer = {balancer}: autoplan prices head-tail balancing (equal causal "
            "work on every cp rank)."
        )
    if series == "0.2" and par.get("context_parallel_rotate_method") == "alltoall":
        unmapped.append(
            "context_parallel_rotate_method = alltoall: torchtitan 0.2.2 applies it only in validation; "
            "training rotates by all-gather, so it is read as allgather."
        )
    if data.get("rotate_method") == "alltoall":
        unmapped.append(
            'set_rotate_method("alltoall"): torchtitan 0.3\'s language models attend with FlexAttention, whose '
            "context parallelism all-gathers keys and values; read as allgather."
        )
    return "allgather"


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
    accumulation = global_batch // (local * dp)  # with PP: that many schedule steps (types/schedule_steps.py)
    steps = {"schedule_steps": accumulation} if degrees["pp"] > 1 and accumulation > 1 else {}
    return {"micro_batch_size": mbs, "num_microbatches": global_batch // (dp * mbs), **steps}


def _read_pipeline(par: dict[str, Any], pp: int, layers: int | None, unmapped: list[str]) -> dict[str, Any]:
    if pp == 1:
        return {"schedule": "1f1b", "virtual_stages": 1}
    name = str(par.get("pipeline_parallel_schedule", "1F1B"))
    multi = name.lower() in MULTI_STAGE
    schedule = schedule_named(name, unmapped)
    chunks = _chunks(par, pp, multi, layers, unmapped)
    virtual = max(chunks // pp, 1) if multi else 1  # read as interleaved_1f1b or interleaved_zb
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


def _read_precision(
    data: dict[str, Any], degrees: dict[str, Any], unmapped: list[str], *, fsdp_always: bool
) -> dict[str, Any]:
    training = data.get("training", {})
    param = training.get("mixed_precision_param", "bfloat16")
    fsdp = fsdp_always or degrees["cp"] > 1 or (degrees["dp"] > 1 and degrees["zero_stage"] > 0)
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
