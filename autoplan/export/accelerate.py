"""A plan as Hugging Face Accelerate's config YAML (``accelerate_fsdp.yaml``), and such a file read back
(the plan-field-to-key table and the multi-machine keys: docs/export-accelerate.md, "The mapping").

The file is what ``accelerate config`` writes and ``accelerate launch --config_file`` reads
(Accelerate 1.16); the tests run it through that launch path and build Accelerate's own
``FullyShardedDataParallelPlugin`` and ``ParallelismConfig`` from it. What the file cannot say is in
:attr:`Exported.unexpressed` and in the comments at its top. A multi-machine file names
``main_process_ip`` (a placeholder unless given, :data:`MACHINE_0`) and ``main_process_port``.
Context parallelism is ``parallelism_config_cp_size`` with torch's backend and ``cp_comm_strategy``
allgather or alltoall (ring); Accelerate's Ulysses is ``sp_size`` under DeepSpeed, read back as ulysses.
"""

from __future__ import annotations

import math
import re
from typing import Any

import yaml

from autoplan.export.activation_offload import activation_offload_notes
from autoplan.export.common import Exported, ExportError, Imported, ModelFacts, split_note
from autoplan.export.local_sgd import local_sgd_notes
from autoplan.export.offload import accelerate_offload_params, read_offload
from autoplan.export.recompute_budget import every_block_note
from autoplan.types.plan import Plan

FILENAME = "accelerate_fsdp.yaml"
MIXED_PRECISION = {"fp32": "no", "bf16": "bf16", "fp16": "fp16", "fp8": "fp8"}
#: The dtype FSDP2 reduces gradients in under each ``mixed_precision``
#: (``FullyShardedDataParallelPlugin.set_mixed_precision``: reduce_dtype = param_dtype; fp8 runs the rest as bf16).
FSDP_REDUCE = {"no": "fp32", "bf16": "bf16", "fp16": "fp16", "fp8": "bf16"}
#: torchrun's and Accelerate's default rendezvous port.
MAIN_PROCESS_PORT = 29500
#: Written for ``main_process_ip`` when the address of machine 0 is not given: never a resolvable
#: host name (an underscore), so a file launched without setting it fails on the name.
MACHINE_0 = "ADDRESS_OF_MACHINE_0"
COMMENT = re.compile(r"^#\s*autoplan\.(\w+):\s*(\S+)", re.MULTILINE)
#: autoplan's cp variant -> Accelerate's ``cp_comm_strategy`` (TorchContextParallelConfig: torch's rotate
#: methods; "alltoall" passes each KV shard to the next rank, a ring)
CP_COMM_STRATEGIES = {"allgather": "allgather", "ring": "alltoall"}


# ---- export -------------------------------------------------------------------------------
def export(
    plan: Plan,
    facts: ModelFacts,
    *,
    devices_per_node: int = 8,
    main_process_ip: str | None = None,
    main_process_port: int = MAIN_PROCESS_PORT,
) -> Exported:
    """``plan`` as Accelerate's config YAML (module docstring); ``devices_per_node`` sets num_machines,
    ``main_process_ip`` and ``main_process_port`` the rendezvous of a multi-machine job."""
    if plan.tp > 1 and plan.dp * plan.pp * plan.cp == 1:  # docs/export.md: what it cannot run at all is refused
        raise ExportError(
            f"Accelerate cannot run tp={plan.tp} alone (dp=1): its FSDP2 config then has no dimension to shard over "
            "and Accelerator() refuses it; load the model with transformers' tp_plan='auto' under a MULTI_GPU "
            "config, or export a plan with dp > 1."
        )
    kind = _distributed_type(plan)
    machines = math.ceil(plan.devices / devices_per_node)
    config: dict[str, Any] = {
        "compute_environment": "LOCAL_MACHINE",
        "debug": False,
        "distributed_type": kind,
        "downcast_bf16": "no",
        "machine_rank": 0,
        "main_training_function": "main",
        "mixed_precision": MIXED_PRECISION[plan.precision],
        "num_machines": machines,
        "num_processes": plan.devices,
        "rdzv_backend": "static",
        "same_network": True,
        "use_cpu": False,
    }
    if machines > 1:
        config |= {"main_process_ip": main_process_ip or MACHINE_0, "main_process_port": main_process_port}
    if plan.precision == "fp8":
        config["fp8_config"] = {"backend": "AO"}  # torchao's float8 training, as autoplan runs it
    if kind == "FSDP":
        config["fsdp_config"] = _fsdp_config(plan, facts)
        config["fsdp_config"]["fsdp_offload_params"] = accelerate_offload_params(plan, offloaded := [])
        if plan.tp > 1 or plan.cp > 1 or plan.dp_replicate > 1:
            config["parallelism_config"] = _parallelism_config(plan)
    unexpressed = _unexpressed(plan, kind) + (offloaded if kind == "FSDP" else [])  # offload: always FSDP
    launch = launch_command(machines=machines, main_process_ip=main_process_ip, main_process_port=main_process_port)
    text = _header(plan, facts, kind, devices_per_node, unexpressed) + _machines_header(machines, launch)
    text += yaml.safe_dump(config, sort_keys=True)
    return Exported(framework="accelerate", filename=FILENAME, text=text, unexpressed=unexpressed, launch=launch)


def launch_command(
    *, machines: int = 1, main_process_ip: str | None = None, main_process_port: int = MAIN_PROCESS_PORT
) -> str:
    """Accelerate's own launcher for this file; on more than one machine, run on each with its rank
    and machine 0's address (``$MACHINE_RANK``, ``$MAIN_PROCESS_IP`` unless the address is given)."""
    if machines == 1:
        return f"accelerate launch --config_file {FILENAME} train.py"
    return (
        f"accelerate launch --config_file {FILENAME} --machine_rank $MACHINE_RANK "
        f"--main_process_ip {main_process_ip or '$MAIN_PROCESS_IP'} --main_process_port {main_process_port} train.py"
    )


def _machines_header(machines: int, launch: str) -> str:
    if machines == 1:
        return ""
    return (
        f"# On each of the {machines} machines, MACHINE_RANK 0..{machines - 1} and MAIN_PROCESS_IP the address of "
        f"machine 0:\n#   {launch}\n"
    )


def _distributed_type(plan: Plan) -> str:
    if plan.zero_stage == 0 and plan.tp == plan.cp == 1:
        return "MULTI_GPU" if plan.devices > 1 else "NO"
    return "FSDP"  # ZeRO-1/2/3, and any tensor or context parallelism (Accelerate composes them only under FSDP2)


def _fsdp_config(plan: Plan, facts: ModelFacts) -> dict[str, Any]:
    fsdp: dict[str, Any] = {
        "fsdp_version": 2,
        "fsdp_reshard_after_forward": plan.zero_stage == 3,
        "fsdp_activation_checkpointing": plan.recompute != "none",
        "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
        "fsdp_offload_params": False,
        "fsdp_state_dict_type": "SHARDED_STATE_DICT",
    }
    if facts.block_class:
        fsdp["fsdp_transformer_layer_cls_to_wrap"] = facts.block_class
    return fsdp


def _parallelism_config(plan: Plan) -> dict[str, Any]:
    """Accelerate's mesh sizes. The pipeline ranks have no Accelerate equivalent; they run as more
    data-parallel ranks. cp runs torch's context parallelism (``cp_backend`` torch) with FSDP2 over
    dp_shard x cp; Ulysses is written as allgather (:func:`_parallel_gaps` says why). HSDP's replicas are
    ``dp_replicate_size`` (FSDP2 on Accelerate's 2-D ``(dp_replicate, dp_shard)`` mesh, types/hsdp.py)."""
    sizes: dict[str, Any] = {
        "parallelism_config_dp_replicate_size": plan.dp_replicate,
        "parallelism_config_dp_shard_size": plan.dp * plan.pp // plan.dp_replicate,
        "parallelism_config_tp_size": plan.tp,
        "parallelism_config_cp_size": plan.cp,
    }
    if plan.cp > 1:
        sizes["parallelism_config_cp_backend"] = "torch"
        sizes["parallelism_config_cp_comm_strategy"] = CP_COMM_STRATEGIES.get(plan.cp_variant, "allgather")
    return sizes


def _header(plan: Plan, facts: ModelFacts, kind: str, devices_per_node: int, unexpressed: list[str]) -> str:
    lines = [
        f"# Accelerate config written by autoplan for {facts.name}: {plan.describe()}",
        f"# num_machines assumes {devices_per_node} devices per machine; set it to the machines you launch on.",
        "# Training-script settings (Accelerate's config has no key for them; `autoplan explain` reads them):",
        f"# autoplan.micro_batch_size: {plan.micro_batch_size}",
        f"# autoplan.gradient_accumulation_steps: {plan.num_microbatches}",
    ]
    if kind == "FSDP" and not facts.block_class:
        lines.append(
            "# fsdp_transformer_layer_cls_to_wrap: add your block class (e.g. LlamaDecoderLayer); without it "
            "Accelerate wraps the model's _no_split_modules."
        )
    lines += ["# Not expressed:"] + [f"# - {sentence}" for sentence in unexpressed]
    return "\n".join(lines) + "\n"


def _unexpressed(plan: Plan, kind: str) -> list[str]:
    found = [
        f"micro_batch_size={plan.micro_batch_size} and gradient accumulation {plan.num_microbatches} are "
        "training-script arguments: the DataLoader's batch_size and "
        f"Accelerator(gradient_accumulation_steps={plan.num_microbatches})."
    ]
    found += _sharding_gaps(plan, kind) + _parallel_gaps(plan) + _reduction_gaps(plan, kind)
    found += activation_offload_notes(plan, "Accelerate")
    found += local_sgd_notes(plan, "Accelerate")
    if plan.recompute != "none" and kind != "FSDP":
        what = "a single-device (NO)" if kind == "NO" else f"a DDP ({kind})"
        found.append(
            f"recompute={plan.recompute}: {what} config has no activation-checkpointing key (Accelerate's one is "
            "fsdp_activation_checkpointing, under FSDP); turn it on in the training script (a Hugging Face model: "
            "model.gradient_checkpointing_enable(); else torch.utils.checkpoint around each block)."
        )
        return found
    if plan.recompute_blocks:
        how = "checkpoints every wrapped block (fsdp_activation_checkpointing is one switch)"
        found.append(every_block_note(plan, trainer="Accelerate", how=how))
    if plan.recompute == "selective":
        found.append(
            "recompute=selective has no Accelerate switch; fsdp_activation_checkpointing checkpoints whole blocks "
            "(full recompute), so it is written as full."
        )
    return found


def _sharding_gaps(plan: Plan, kind: str) -> list[str]:
    if kind != "FSDP" or plan.zero_stage >= 2:
        return []
    if plan.zero_stage == 1:
        return [
            "zero_stage=1 (optimizer states sharded) has no FSDP2 equivalent; written as the nearest, "
            "reshard_after_forward=false (ZeRO-2: gradients sharded too)."
        ]
    what = f"tp={plan.tp}" if plan.tp > 1 else f"cp={plan.cp}"
    return [
        f"zero_stage=0 with {what}: Accelerate composes tensor and context parallelism only under FSDP2 (sharded "
        "over dp_shard x cp), so this is written as FSDP2 with reshard_after_forward=false (ZeRO-2)."
    ]


def _parallel_gaps(plan: Plan) -> list[str]:
    found = []
    if plan.pp > 1:
        found.append(
            f"pp={plan.pp} ({plan.schedule}): Accelerate has no pipeline parallelism; the {plan.devices} processes "
            f"run as {plan.dp * plan.pp} data-parallel ranks, so the global batch is {plan.pp}x the plan's unless "
            "gradient_accumulation_steps is divided by pp."
        )
    if plan.tp > 1:
        found.append(
            f"tp={plan.tp}: Accelerate applies the model's own tensor-parallel plan (a transformers model's "
            "tp_plan), not autoplan's tp_plan."
        )
        note = split_note(plan)
        found += [note] if note else []
    if plan.sequence_parallel or plan.tp_comm_overlap:
        found.append(
            "sequence_parallel / tp_comm_overlap have no Accelerate config key (its sp_size is DeepSpeed Ulysses; "
            "async TP is TorchTensorParallelConfig(enable_async_tp=True) in code)."
        )
    if plan.ep > 1 or plan.expert_tp > 1:
        found.append(f"ep={plan.ep}, expert_tp={plan.expert_tp}: Accelerate's config has no expert parallelism.")
    if plan.cp > 1 and plan.cp_variant == "ulysses":
        found.append(
            f"cp={plan.cp} ulysses: Accelerate's Ulysses is sp_size under DeepSpeed (sp_backend deepspeed), not "
            "under FSDP2; written as torch context parallelism with allgather, which moves other bytes."
        )
    return found


def _reduction_gaps(plan: Plan, kind: str) -> list[str]:
    runs = FSDP_REDUCE[MIXED_PRECISION[plan.precision]] if kind == "FSDP" else "fp32"
    found = []
    if plan.grad_reduce_dtype != runs:
        how = (
            "FullyShardedDataParallelPlugin(mixed_precision_policy={'param_dtype': ..., 'reduce_dtype': ...})"
            if kind == "FSDP"
            else "DistributedDataParallelKwargs(comm_hook=DDPCommunicationHookType.BF16 or FP16)"
        )
        found.append(
            f"grad_reduce_dtype={plan.grad_reduce_dtype}: this config reduces gradients in {runs}; another dtype "
            f"is code: {how}."
        )
    if plan.grad_compression == "powersgd":
        found.append(
            f"grad_compression=powersgd is code: DistributedDataParallelKwargs(comm_hook=DDPCommunicationHookType."
            f"POWER_SGD, comm_state_option={{'matrix_approximation_rank': {plan.powersgd_rank}}})."
        )
    if plan.grad_compression == "topk":
        found.append(
            f"grad_compression=topk (ratio {plan.topk_ratio:g}) is code: DDPCommunicationHookType has no top-k; "
            "register autoplan's hook on the prepared model: model.register_comm_hook(TopKState(group=None, "
            f"ratio={plan.topk_ratio:g}), topk_hook) (autoplan.execute.topk_hook)."
        )
    if not plan.overlap_grad_reduce:
        found.append(
            "overlap_grad_reduce=false: DDP and FSDP2 always overlap the gradient reduction with the backward."
        )
    return found


# ---- read ---------------------------------------------------------------------------------
def read(text: str, *, devices: int | None = None, batch_size: int | None = None) -> Imported:
    """An Accelerate config YAML back to plan fields (module docstring). Micro-batch and gradient
    accumulation come from the ``# autoplan.`` comments, else from ``batch_size`` (the global batch)."""
    config = yaml.safe_load(text)
    if not isinstance(config, dict) or "distributed_type" not in config:
        raise ExportError(
            "Accelerate config must be a YAML mapping with distributed_type (as `accelerate config` writes)."
        )
    unmapped: list[str] = []
    world = int(config.get("num_processes") or devices or 1)
    assumptions = [] if config.get("num_processes") else [_world_assumption(world, devices)]
    kind = str(config["distributed_type"])
    tp, dp = _read_degrees(config, world, unmapped)
    cp = _read_cp(config)
    if dp % cp["cp"]:
        raise ExportError(f"num_processes {world} is not a multiple of tp {tp} x cp {cp['cp']}.")
    dp //= cp["cp"]
    mixed = str(config.get("mixed_precision") or "no").lower()
    fields = {
        "devices": world,
        "dp": dp,
        "tp": tp,
        "pp": 1,
        **cp,
        **_read_batch(text, dp, batch_size, assumptions),
        **_read_sharding(config, kind, unmapped),
        "precision": {"no": "fp32", "bf16": "bf16", "fp16": "fp16", "fp8": "fp8"}.get(mixed, "fp32"),
        "grad_reduce_dtype": FSDP_REDUCE.get(mixed, "fp32") if kind == "FSDP" else "fp32",
    }
    fields |= _read_replicas(config, fields, unmapped)
    offloads = bool((config.get("fsdp_config") or {}).get("fsdp_offload_params"))  # FSDP2's CPUOffloadPolicy
    fields["offload"] = read_offload(
        optimizer=False,
        params=offloads,
        zero_stage=fields["zero_stage"],
        unmapped=unmapped,
        source="fsdp_offload_params",
    )
    return Imported(framework="accelerate", fields=fields, unmapped=unmapped, assumptions=assumptions)


def _world_assumption(world: int, devices: int | None) -> str:
    source = "from --devices" if devices else "(Accelerate's default; pass --devices for the world size)"
    return f"num_processes not stated: read as {world} {source}."


def _read_degrees(config: dict, world: int, unmapped: list[str]) -> tuple[int, int]:
    sizes = config.get("parallelism_config") or {}
    tp = int(sizes.get("parallelism_config_tp_size", 1))
    if world % tp:
        raise ExportError(f"num_processes {world} is not a multiple of parallelism_config_tp_size {tp}.")
    return tp, world // tp


def _read_replicas(config: dict, fields: dict[str, Any], unmapped: list[str]) -> dict[str, Any]:
    """``dp_replicate_size`` R as HSDP's dp_replicate (types/hsdp.py) where autoplan runs it: FSDP over 2 or more
    of the dp ranks per replica, without context parallelism; otherwise said and read as one replica."""
    replicas = int((config.get("parallelism_config") or {}).get("parallelism_config_dp_replicate_size", 1))
    if replicas == 1:
        return {}
    dp = fields["dp"]
    if fields["zero_stage"] >= 1 and fields["cp"] == 1 and dp % replicas == 0 and dp // replicas >= 2:
        return {"dp_replicate": replicas}
    unmapped.append(
        f"dp_replicate_size {replicas} (HSDP): autoplan's HSDP needs FSDP over 2 or more of the {dp} data-parallel "
        "ranks per replica, without context parallelism; priced as sharding over all of them."
    )
    return {}


def _read_cp(config: dict) -> dict[str, Any]:
    """cp and its variant: ``cp_size`` is torch's context parallelism (``cp_comm_strategy`` allgather, or
    alltoall: ring), ``sp_size`` DeepSpeed's Ulysses (``sp_backend`` deepspeed); Accelerate refuses both."""
    sizes = config.get("parallelism_config") or {}
    cp, sp = int(sizes.get("parallelism_config_cp_size", 1)), int(sizes.get("parallelism_config_sp_size", 1))
    if cp > 1 and sp > 1:
        raise ExportError(
            f"parallelism_config_cp_size {cp} with parallelism_config_sp_size {sp}: Accelerate refuses context "
            "and sequence parallelism together; set one of them to 1."
        )
    if sp > 1:
        return {"cp": sp, "cp_variant": "ulysses"}
    strategy = str(sizes.get("parallelism_config_cp_comm_strategy", "allgather"))
    variants = {method: variant for variant, method in CP_COMM_STRATEGIES.items()}
    if strategy not in variants:
        raise ExportError(f"parallelism_config_cp_comm_strategy {strategy}: Accelerate takes allgather or alltoall.")
    return {"cp": cp, "cp_variant": variants[strategy]}


def _read_batch(text: str, dp: int, batch_size: int | None, assumptions: list[str]) -> dict[str, int]:
    """Micro-batch and accumulation steps: training-script arguments, so from the exporter's
    ``# autoplan.`` comments, else ``batch_size`` (--batch) over the dp ranks, else one per device."""
    found = {key: int(value) for key, value in COMMENT.findall(text) if value.isdigit()}
    if "micro_batch_size" in found:
        return {
            "micro_batch_size": found["micro_batch_size"],
            "num_microbatches": found.get("gradient_accumulation_steps", 1),
        }
    script = "the micro-batch is a training-script argument"
    if batch_size is not None:
        if batch_size % dp:
            raise ExportError(f"batch size {batch_size} does not divide over {dp} data-parallel ranks.")
        assumptions.append(f"{script}: read as --batch {batch_size} / dp {dp} = {batch_size // dp}, no accumulation.")
        return {"micro_batch_size": batch_size // dp, "num_microbatches": 1}
    assumptions.append(f"{script}: read as 1 per device, no accumulation (pass --batch for the global batch).")
    return {"micro_batch_size": 1, "num_microbatches": 1}


def _read_sharding(config: dict, kind: str, unmapped: list[str]) -> dict[str, Any]:
    fsdp = config.get("fsdp_config") or {}
    recompute = "full" if fsdp.get("fsdp_activation_checkpointing") else "none"
    if kind in ("NO", "MULTI_GPU"):
        return {"zero_stage": 0, "recompute": recompute}
    if kind == "DEEPSPEED":
        unmapped.append("distributed_type DEEPSPEED: read its deepspeed_config_file with --framework deepspeed.")
        return {"zero_stage": int((config.get("deepspeed_config") or {}).get("zero_stage", 0)), "recompute": recompute}
    if kind != "FSDP":
        raise ExportError(f"distributed_type {kind}: autoplan reads NO, MULTI_GPU, FSDP and DEEPSPEED configs.")
    if int(fsdp.get("fsdp_version", 1)) == 2:
        reshard = str(fsdp.get("fsdp_reshard_after_forward", True)).lower() in ("true", "1", "yes")
        return {"zero_stage": 3 if reshard else 2, "recompute": recompute}
    strategy = str(fsdp.get("fsdp_sharding_strategy", "FULL_SHARD")).upper()
    stages = {"FULL_SHARD": 3, "HYBRID_SHARD": 3, "SHARD_GRAD_OP": 2, "_HYBRID_SHARD_ZERO2": 2, "NO_SHARD": 0}
    if strategy.startswith("_HYBRID") or strategy == "HYBRID_SHARD":
        unmapped.append(f"fsdp_sharding_strategy {strategy} (HSDP): autoplan prices sharding over all dp ranks.")
    return {"zero_stage": stages.get(strategy, 3), "recompute": recompute}
