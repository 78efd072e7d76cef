"""A DeepSpeed JSON config read back into plan fields (docs/export.md, docs/export-deepspeed.md).

The batch values are derived as DeepSpeed derives them (:func:`_read_batch`); a key that is
``"auto"`` (the Hugging Face Trainer fills it in) or absent takes ``--batch`` or DeepSpeed's
default, and each such value is named in ``Imported.assumptions``. DeepSpeed takes the world
size from its launcher, not the file: it is ``devices`` when given, else what the batch keys
imply (``train_batch_size / (micro · accumulation)``), else the ``"autoplan"`` section's
``global_batch_size`` that autoplan's own export writes (under AutoTP the file leaves out
``train_batch_size``: deepspeed.py's module docstring).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from autoplan.export.common import ExportError, Imported, ModelFacts

#: The top-level key autoplan's export writes its own facts under (DeepSpeed ignores unknown keys).
SECTION = "autoplan"


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
    sp = int(config.get("sequence_parallel_size") or 1)  # Ulysses: DeepSpeed's data-parallel world is world / sp
    if SECTION not in config:
        unmapped.append("DeepSpeed's JSON has no pipeline degree (PipelineModule is code); read as pp=1.")
    own_batch = section.get("global_batch_size")  # autoplan's export states it where DeepSpeed's key is left out
    batch = _read_batch(config, devices, tp * pp * sp, batch_size, own_batch)
    world = (
        "--devices"
        if devices is not None
        else "the three batch values"
        if config.get("train_batch_size") not in (None, "auto")
        else f"the 'autoplan' section's global batch {own_batch}"
    )
    assumptions += [
        f"world size {batch.dp * tp * pp * sp} from {world} (DeepSpeed takes it from its launcher).",
        *batch.assumptions,
    ]
    expert = config.get("expert_parallel") or {}
    fields = {
        "devices": batch.dp * tp * pp * sp,
        "dp": batch.dp,
        "tp": tp,
        "pp": pp,
        "cp": sp,
        "cp_variant": "ulysses" if sp > 1 else "allgather",
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


def _read_batch(
    config: dict, devices: int | None, model_parallel: int, batch_size: int | None, own_batch: int | None = None
) -> _Batch:
    """The batch values as DeepSpeed derives them from any two of its three keys
    (``DeepSpeedConfig._set_batch_related_parameters``: ``train_batch_size = micro · accumulation · dp``).
    A key that is ``"auto"`` (the Hugging Face Trainer fills it in) or absent is unknown; the global batch
    ``batch_size`` (``--batch``) stands for an unknown ``train_batch_size``, and what is still unknown
    takes DeepSpeed's default (one accumulation step, else one sample per device). Each such value is
    named in ``assumptions``. ``own_batch`` (the ``"autoplan"`` section's global batch) gives the
    data-parallel size where ``train_batch_size`` is left out and ``devices`` is not given."""
    stated = {key: config.get(key) for key in BATCH_KEYS}
    known = [None if v in (None, "auto") else int(v) for v in stated.values()]
    implied = [own_batch if known[0] is None and own_batch else known[0], *known[1:]]
    batch = _Batch(_read_dp(implied, devices, model_parallel), *known)
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
    if (config.get("activation_checkpointing") or {}).get("cpu_checkpointing"):
        found.append("activation_checkpointing.cpu_checkpointing: autoplan does not price activations kept on the CPU.")
    for key in ("zenflow", "compile", "torch_autocast", "curriculum_learning", "data_efficiency"):
        if config.get(key):
            found.append(f"{key}: autoplan does not price it.")
    return found
