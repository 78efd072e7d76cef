"""A plan as DeepSpeed's JSON config (``ds_config.json``), and such a config read back.

DeepSpeed 0.19 reads the config in ``deepspeed.runtime.config.DeepSpeedConfig``; the tests load
every exported file with it. Mapping (plan field → JSON key):

| plan | ds_config.json | note |
|---|---|---|
| ``dp·micro_batch_size·num_microbatches`` | ``train_batch_size`` | DeepSpeed asserts ``= mbs·ga·dp``; none if tp > 1 |
| ``micro_batch_size`` | ``train_micro_batch_size_per_gpu`` | |
| ``num_microbatches`` | ``gradient_accumulation_steps`` | also the pipeline's micro-batches |
| ``zero_stage`` 0–3 | ``zero_optimization.stage`` | ZeRO-3 frees gathered weights after forward; pp > 1: ZeRO-1 |
| ``overlap_grad_reduce`` | ``zero_optimization.overlap_comm`` | stage 0 all-reduces after the backward, always |
| ``precision`` bf16 / fp16 | ``bf16.enabled`` / ``fp16.enabled`` | fp16 with a dynamic loss scale (``loss_scale: 0``) |
| ``precision`` fp8 | ``bf16.enabled`` | DeepSpeed's FP8 is Transformer Engine, in model code |
| ``grad_reduce_dtype`` | ``communication_data_type`` | absent: DeepSpeed reduces in the training dtype |
| (fp32 accumulation) | ``data_types.grad_accum_dtype`` | ``"fp32"``; the training dtype at ZeRO-0 bf16/fp16 |
| ``recompute`` full / selective | ``activation_checkpointing`` | options only; model code checkpoints |
| ``tp`` | ``tensor_parallel.autotp_size`` | AutoTP training: DeepSpeed's own split |
| ``ep`` | ``expert_parallel: {enabled, autoep_size}`` | AutoEP: DeepSpeed finds the MoE layers itself |
| ``pp``, ``schedule``, ``virtual_stages``, ``stages`` | ``"autoplan"`` section | ``PipelineModule`` is code |

``deepspeed.initialize`` refuses two things its config loader accepts, so the writer avoids them
(the tests start the engine on every family): without ZeRO, a bf16 or fp16 model whose
``grad_accum_dtype`` is fp32 (``DeepSpeedEngine._do_optimizer_sanity_check``: "unsupported mix");
and under AutoTP a ``train_batch_size`` of ``mbs·ga·dp``, because with the tensor-parallel
degree given only in the config, ``DeepSpeedConfig`` checks the batch against the whole world
size, tp ranks included (``mbs·ga·dp·tp``): the micro-batch and accumulation steps say it all.

The JSON has no comments, so the sentences of :attr:`Exported.unexpressed` also go in the
``"autoplan"`` section's ``"unexpressed"`` list; DeepSpeed ignores unknown top-level keys.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from autoplan.export.common import Exported, ExportError, Imported, ModelFacts, layers_per_stage, split_note
from autoplan.types.plan import Plan

FILENAME = "ds_config.json"
SECTION = "autoplan"
#: DeepSpeed's dynamic loss scaling for fp16: ``loss_scale: 0`` means dynamic, starting at 2**16.
FP16_DYNAMIC = {"enabled": True, "loss_scale": 0, "initial_scale_power": 16, "loss_scale_window": 1000,
                "hysteresis": 2, "min_loss_scale": 1}  # fmt: skip
#: ``deepspeed.checkpointing``'s options, left at DeepSpeed's defaults (nothing partitioned or offloaded).
CHECKPOINTING = {"partition_activations": False, "contiguous_memory_optimization": False, "cpu_checkpointing": False,
                 "number_checkpoints": None, "synchronize_checkpoint_boundary": False, "profile": False}  # fmt: skip


# ---- export -------------------------------------------------------------------------------
def export(plan: Plan, facts: ModelFacts) -> Exported:
    """``plan`` as a DeepSpeed JSON config (module docstring)."""
    unexpressed = _unexpressed(plan, facts)
    config: dict[str, Any] = {
        **_batch(plan),
        "zero_optimization": _zero(plan),
        **_precision(plan),
        "communication_data_type": plan.grad_reduce_dtype,
        "data_types": {"grad_accum_dtype": grad_accum_dtype(plan)},
    }
    if plan.recompute != "none":
        config["activation_checkpointing"] = dict(CHECKPOINTING)
    if plan.tp > 1:
        config["tensor_parallel"] = {"autotp_size": plan.tp}
    if plan.ep > 1:
        config["expert_parallel"] = {"enabled": True, "autoep_size": plan.ep}
    config[SECTION] = _section(plan, facts, unexpressed)
    return Exported(
        framework="deepspeed",
        filename=FILENAME,
        text=json.dumps(config, indent=2) + "\n",
        unexpressed=unexpressed,
        launch=launch_command(plan),
    )


def launch_command(plan: Plan, *, devices_per_node: int = 8) -> str:
    """DeepSpeed's own launcher for this file (``devices_per_node`` GPUs a node, 8 unless told)."""
    per_node = min(plan.devices, devices_per_node)
    nodes = -(-plan.devices // per_node)
    return f"deepspeed --num_nodes {nodes} --num_gpus {per_node} train.py --deepspeed --deepspeed_config {FILENAME}"


def zero_stage(plan: Plan) -> int:
    """The ZeRO stage DeepSpeed runs: its PipelineEngine refuses ZeRO-2/3, so a pipeline gets ZeRO-1."""
    return min(plan.zero_stage, 1) if plan.pp > 1 else plan.zero_stage


def grad_accum_dtype(plan: Plan) -> str:
    """The dtype DeepSpeed accumulates gradients in: fp32, except without ZeRO under bf16/fp16, where
    ``DeepSpeedEngine._do_optimizer_sanity_check`` accepts only the model's own dtype (its
    FP16_Optimizer, or for a bf16 pipeline its BF16_Optimizer, which accumulates in fp32 anyway)."""
    if zero_stage(plan) > 0 or plan.precision == "fp32":
        return "fp32"
    return "fp16" if plan.precision == "fp16" else "bf16"  # fp8 trains the rest in bf16 (_precision)


def _batch(plan: Plan) -> dict[str, int]:
    # Under AutoTP DeepSpeedConfig would check train_batch_size against mbs·ga·(dp·tp) (module docstring).
    sizes = {
        "train_micro_batch_size_per_gpu": plan.micro_batch_size,
        "gradient_accumulation_steps": plan.num_microbatches,
    }
    return sizes if plan.tp > 1 else {"train_batch_size": plan.global_batch_size, **sizes}


def _zero(plan: Plan) -> dict[str, Any]:
    # Stage 0 has no overlap switch: DeepSpeed all-reduces after the backward (engine.allreduce_gradients).
    zero: dict[str, Any] = {"stage": zero_stage(plan)}
    if zero["stage"] > 0:
        zero["overlap_comm"] = plan.overlap_grad_reduce
    return zero


def _precision(plan: Plan) -> dict[str, Any]:
    if plan.precision in ("bf16", "fp8"):
        return {"bf16": {"enabled": True}}
    if plan.precision == "fp16":
        return {"fp16": dict(FP16_DYNAMIC)}
    return {}


def _section(plan: Plan, facts: ModelFacts, unexpressed: list[str]) -> dict[str, Any]:
    """What DeepSpeed's JSON cannot hold, for a reader (and :func:`read`); DeepSpeed ignores it."""
    return {
        "model": facts.name,
        "pp": plan.pp,
        "schedule": plan.schedule,
        "virtual_stages": plan.virtual_stages,
        "tp": plan.tp,
        "global_batch_size": plan.global_batch_size,
        "stages": plan.stages,
        "unexpressed": list(unexpressed),
    }


def _unexpressed(plan: Plan, facts: ModelFacts) -> list[str]:
    found = _pipeline_gaps(plan, facts) + _tensor_gaps(plan)
    if grad_accum_dtype(plan) != "fp32" and not (plan.pp > 1 and plan.precision != "fp16"):
        found.append(
            f"zero_stage=0 with {plan.precision}: DeepSpeed without ZeRO holds and accumulates gradients in the "
            f"training dtype ({grad_accum_dtype(plan)}; fp32 accumulation needs ZeRO-1 or more), so gradient memory "
            "is half what autoplan priced, and long accumulation loses precision."
        )
    if plan.zero_stage == 0 and plan.overlap_grad_reduce and plan.dp > 1:
        found.append(
            "overlap_grad_reduce: DeepSpeed without ZeRO all-reduces gradients after the backward at the "
            "accumulation boundary; it has no switch to overlap them with the backward (ZeRO-1+ has overlap_comm)."
        )
    if plan.recompute != "none":
        found.append(
            "recompute: DeepSpeed's checkpointing is invoked by model code (deepspeed.checkpointing.checkpoint "
            "around each block, or PipelineModule(activation_checkpoint_interval=1)); the config only sets its "
            "options."
        )
    if plan.recompute == "selective":
        found.append(
            "recompute=selective (attention only) has no DeepSpeed equivalent; checkpointing whole blocks is "
            "full recompute, which costs more compute."
        )
    if plan.precision == "fp8":
        found.append(
            "precision=fp8: DeepSpeed's FP8 goes through Transformer Engine layers in model code; the config "
            "says bf16 for everything else."
        )
    if plan.grad_compression == "powersgd":
        found.append(
            f"grad_compression=powersgd (rank {plan.powersgd_rank}) has no DeepSpeed switch; its compressed "
            "optimizers (1-bit Adam, 0/1 Adam) are different algorithms."
        )
    return found


def _pipeline_gaps(plan: Plan, facts: ModelFacts) -> list[str]:
    if plan.pp == 1:
        return []
    blocks = f"its {facts.layers} blocks" if facts.layers else "its blocks"
    found = [
        f"pp={plan.pp}: DeepSpeed's JSON has no pipeline degree; build the model as deepspeed.pipe.PipelineModule("
        f"layers=..., num_stages={plan.pp}, partition_method='uniform') over {blocks} and train it with "
        "engine.train_batch()."
    ]
    if plan.stages and not layers_per_stage(plan):
        sizes = [len(stage) for stage in plan.stages]
        found.append(
            f"stages of {sizes} blocks: DeepSpeed's partition methods (uniform, parameters, type:REGEX) take no "
            "explicit split; the 'autoplan' section lists autoplan's."
        )
    if plan.zero_stage >= 2:
        found.append(
            f"zero_stage={plan.zero_stage} with pp={plan.pp}: DeepSpeed's PipelineEngine refuses ZeRO-2/3, so the "
            "config says ZeRO-1 (optimizer states sharded, gradients and weights not)."
        )
    if plan.schedule != "1f1b" or plan.virtual_stages > 1:
        found.append(
            f"schedule={plan.schedule} (virtual_stages={plan.virtual_stages}): DeepSpeed runs its one 1F1B "
            "TrainSchedule, one chunk per stage; it has no GPipe or interleaved schedule."
        )
    return found


def _tensor_gaps(plan: Plan) -> list[str]:
    if plan.tp == 1:
        return []
    found = [
        f"tp={plan.tp}: written as tensor_parallel.autotp_size (DeepSpeed AutoTP training), which splits the "
        "model's linear layers by its own rules (Hugging Face models), not by autoplan's tp_plan.",
        f"train_batch_size is left out: under AutoTP DeepSpeed checks it against every rank, tp ranks included "
        f"(micro-batch x accumulation x {plan.devices // plan.pp} ranks), not the {plan.dp} data-parallel ranks; "
        f"the plan's global batch of {plan.global_batch_size} is in the 'autoplan' section.",
    ]
    note = split_note(plan)
    if note:
        found.append(note)
    if plan.sequence_parallel:
        found.append(
            "sequence_parallel (Megatron's, over the tp ranks) has no DeepSpeed switch; its sequence_parallel_size "
            "is Ulysses attention-head parallelism, a different scheme."
        )
    if plan.tp_comm_overlap:
        found.append("tp_comm_overlap has no DeepSpeed AutoTP switch; its collectives run unoverlapped.")
    return found


# ---- read ---------------------------------------------------------------------------------
def read(text: str, *, devices: int | None = None, batch_size: int | None = None) -> Imported:
    """A DeepSpeed JSON config back to plan fields (module docstring); ``devices`` is the world size
    (DeepSpeed takes it from the launcher, not the file), ``batch_size`` the global batch where the
    file leaves it to the Hugging Face Trainer (``"auto"``) or does not state it."""
    try:
        config = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ExportError(f"DeepSpeed config is not valid JSON ({exc.msg} at line {exc.lineno}).") from None
    if not isinstance(config, dict):
        raise ExportError("DeepSpeed config must be a JSON object.")
    section = config.get(SECTION) or {}
    unmapped: list[str] = []
    assumptions: list[str] = []
    layout = _read_layout(config, section, devices, batch_size, unmapped, assumptions)
    zero = config.get("zero_optimization") or {}
    fields = {
        **layout,
        **_read_precision(config),
        **_read_zero(zero, unmapped),
        "recompute": "full" if config.get("activation_checkpointing") is not None else "none",
    }
    if fields["recompute"] == "full":
        unmapped.append(
            "activation_checkpointing only configures deepspeed.checkpointing; read as full recompute, which "
            "holds when the model code checkpoints every block."
        )
    unmapped += _read_unmapped(config, zero)
    facts = ModelFacts(name=section.get("model", "model"))
    return Imported(framework="deepspeed", fields=fields, unmapped=unmapped, facts=facts, assumptions=assumptions)


def _read_layout(
    config: dict, section: dict, devices: int | None, batch_size: int | None, unmapped: list[str], assumptions: list
) -> dict[str, Any]:
    tp = int((config.get("tensor_parallel") or {}).get("autotp_size", section.get("tp", 1)) or 1)
    pp = int(section.get("pp", 1))
    if SECTION not in config:
        unmapped.append("DeepSpeed's JSON has no pipeline degree (PipelineModule is code); read as pp=1.")
    batch = _read_batch(config, devices, tp * pp, batch_size)
    world = "--devices" if devices is not None else "the three batch values"
    assumptions += [
        f"world size {batch.dp * tp * pp} from {world} (DeepSpeed takes it from its launcher).",
        *batch.assumptions,
    ]
    expert = config.get("expert_parallel") or {}
    fields = {
        "devices": batch.dp * tp * pp,
        "dp": batch.dp,
        "tp": tp,
        "pp": pp,
        "micro_batch_size": batch.micro,
        "num_microbatches": batch.accumulation,
        "ep": int(expert.get("autoep_size", 1)) if expert.get("enabled") else 1,
    }
    if pp > 1:
        fields["schedule"] = "1f1b"  # the one schedule DeepSpeed runs
        stages = section.get("stages") or []
        if stages and len(stages) == pp:
            fields["stages"] = [list(s) for s in stages]
    return fields


BATCH_KEYS = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")


@dataclass
class _Batch:
    """DeepSpeed's three batch values and the data-parallel size, with how each unstated one was filled in."""

    dp: int
    total: int | None  # train_batch_size
    micro: int | None  # train_micro_batch_size_per_gpu
    accumulation: int | None  # gradient_accumulation_steps
    defaulted: set[str] = field(default_factory=set)  # keys that took DeepSpeed's default of 1
    assumptions: list[str] = field(default_factory=list)


def _read_batch(config: dict, devices: int | None, model_parallel: int, batch_size: int | None) -> _Batch:
    """The batch values as DeepSpeed derives them from any two of its three keys
    (``DeepSpeedConfig._set_batch_related_parameters``: ``train_batch_size = micro · accumulation · dp``).
    A key that is ``"auto"`` (the Hugging Face Trainer fills it in) or absent is unknown; the global batch
    ``batch_size`` (``--batch``) stands for an unknown ``train_batch_size``, and what is still unknown
    takes DeepSpeed's default (one accumulation step, else one sample per device). Each such value is
    named in ``assumptions``."""
    stated = {key: config.get(key) for key in BATCH_KEYS}
    known = [None if v in (None, "auto") else int(v) for v in stated.values()]
    batch = _Batch(_read_dp(known, devices, model_parallel), *known)
    from_batch = batch_size is not None and batch.total is None and None in (batch.micro, batch.accumulation)
    if from_batch:
        batch.total = batch_size
    _derive_batch(batch)
    batch.assumptions = _batch_assumptions(stated, batch, from_batch=from_batch)
    return batch


def _batch_assumptions(stated: dict, batch: _Batch, *, from_batch: bool) -> list[str]:
    """One sentence per batch key the config leaves unknown, saying what it was read as."""
    found = []
    resolved = dict(zip(BATCH_KEYS, (batch.total, batch.micro, batch.accumulation), strict=True))
    for key, value in stated.items():
        if value not in (None, "auto"):
            continue
        how = '"auto"' if value == "auto" else "not stated"
        if key == "train_batch_size":
            source = " from --batch" if from_batch else " (micro-batch x accumulation x data-parallel size)"
            if "train_micro_batch_size_per_gpu" in batch.defaulted:
                source += ": pass --batch for the global batch"
        elif key in batch.defaulted:
            source = " (DeepSpeed's default)"
        else:
            source = f" (train_batch_size over the other two and data-parallel size {batch.dp})"
        found.append(f"DeepSpeed {key} {how}: read as {resolved[key]}{source}.")
    return found


def _read_dp(known: list[int | None], devices: int | None, model_parallel: int) -> int:
    total, micro, accumulation = known
    if devices is not None:
        if devices % model_parallel:
            raise ExportError(f"--devices {devices} is not a multiple of tp*pp = {model_parallel} in the config.")
        return devices // model_parallel
    if None not in known and total % (micro * accumulation) == 0:
        return total // (micro * accumulation)
    raise ExportError("DeepSpeed takes the world size from its launcher; pass --devices for this config.")


def _derive_batch(batch: _Batch) -> None:
    """Fill the unknown batch values as DeepSpeed does (:func:`_read_batch`), or one sentence."""
    if batch.accumulation is None and (batch.total is None or batch.micro is None):
        batch.accumulation = 1
        batch.defaulted.add("gradient_accumulation_steps")
    if batch.total is None:
        if batch.micro is None:
            batch.micro = 1
            batch.defaulted.add("train_micro_batch_size_per_gpu")
        batch.total = batch.micro * batch.accumulation * batch.dp
    elif batch.micro is None:
        batch.micro = _divide(batch.total, batch.accumulation * batch.dp, "train_micro_batch_size_per_gpu", batch)
    elif batch.accumulation is None:
        batch.accumulation = _divide(batch.total, batch.micro * batch.dp, "gradient_accumulation_steps", batch)
    if batch.total != batch.micro * batch.accumulation * batch.dp:
        raise ExportError(
            f"train_batch_size {batch.total} != train_micro_batch_size_per_gpu {batch.micro} * "
            f"gradient_accumulation_steps {batch.accumulation} * data-parallel size {batch.dp}; "
            "DeepSpeed refuses this config."
        )


def _divide(total: int, by: int, key: str, batch: _Batch) -> int:
    if total % by:
        raise ExportError(
            f"global batch {total} does not divide into {key} over data-parallel size {batch.dp} "
            f"(micro-batch {batch.micro or '?'}, accumulation {batch.accumulation or '?'}); "
            "pass a --batch that does, or state the batch keys in the config."
        )
    return total // by


def _read_precision(config: dict) -> dict[str, str]:
    precision = "fp32"
    if (config.get("bf16") or config.get("bfloat16") or {}).get("enabled"):
        precision = "bf16"
    elif (config.get("fp16") or {}).get("enabled"):
        precision = "fp16"
    # Absent, DeepSpeed reduces in the training dtype (engine.communication_data_type).
    reduce = config.get("communication_data_type") or precision
    if reduce == "auto":
        reduce = precision
    return {"precision": precision, "grad_reduce_dtype": str(reduce).lower()}


def _read_zero(zero: dict, unmapped: list[str]) -> dict[str, Any]:
    stage = int(zero.get("stage", 0))
    overlap = bool(zero.get("overlap_comm", stage == 3)) if stage else False
    if stage >= 2 and not overlap:
        unmapped.append(
            "overlap_comm=false with ZeRO-2/3: DeepSpeed still reduces in the backward's hooks; autoplan prices "
            "that reduction as overlapped."
        )
        overlap = True
    return {"zero_stage": stage, "overlap_grad_reduce": overlap}


def _read_unmapped(config: dict, zero: dict) -> list[str]:
    found = []
    for key in ("offload_param", "offload_optimizer"):
        device = (zero.get(key) or {}).get("device", "none")
        if device not in (None, "none"):
            found.append(f"zero_optimization.{key} to {device}: autoplan does not price CPU/NVMe offload.")
    if int(config.get("sequence_parallel_size", 1) or 1) > 1:
        found.append("sequence_parallel_size (Ulysses sequence parallelism): autoplan does not price it.")
    if (config.get("activation_checkpointing") or {}).get("cpu_checkpointing"):
        found.append("activation_checkpointing.cpu_checkpointing: autoplan does not price activations kept on the CPU.")
    for key in ("zenflow", "compile", "torch_autocast", "curriculum_learning", "data_efficiency"):
        if config.get(key):
            found.append(f"{key}: autoplan does not price it.")
    return found
