"""``Plan.offload`` in each framework's terms, and read back (docs/export.md, "Offload"):

- optimizer: DeepSpeed ``zero_optimization.offload_optimizer: {device: cpu}``; Megatron-LM
  ``--optimizer-cpu-offload --optimizer-offload-fraction 1.0 --use-precision-aware-optimizer`` (validate_args
  requires the last); torchtitan and Accelerate's FSDP: one sentence;
- full: DeepSpeed also ``offload_param: {device: cpu}`` (stage 3); torchtitan ``training.enable_cpu_offload``
  (FSDP2's ``CPUOffloadPolicy``); Accelerate ``fsdp_offload_params``; Megatron-LM: one sentence.

The keys are DeepSpeed's ``DeepSpeedZeroOffloadOptimizerConfig``/``...ParamConfig``, torchtitan 0.3.0's
``TrainingConfig.enable_cpu_offload``, Megatron-Core's ``OptimizerConfig.optimizer_cpu_offload`` and
``optimizer_offload_fraction`` (their Megatron-LM flags), Accelerate's FSDP plugin ``cpu_offload``
(``FSDP_OFFLOAD_PARAMS``). A framework that cannot say a plan's offload gets one sentence in ``unexpressed``.
"""

from __future__ import annotations

from typing import Any

from autoplan.types.plan import Plan

PINNED_CPU = {"device": "cpu", "pin_memory": True}


def _cannot(plan: Plan, framework: str, instead: str) -> str:
    return f"offload={plan.offload}: {framework} cannot offload {instead}; the config holds every state on the GPU."


def deepspeed_offload(config: dict[str, Any], plan: Plan, stage: int, unexpressed: list[str]) -> None:
    """Add the offload to a DeepSpeed config: ``zero_optimization``'s offload entries (ZeRO-Offload needs ZeRO
    >= 1; parameters offload at stage 3 only), and ``zero_force_ds_cpu_optimizer: false``, without which
    DeepSpeed refuses the training script's own torch optimizer under offload (its start-up check, run by
    tests/unit/export/test_deepspeed_start.py)."""
    if plan.offload == "none":
        return
    if stage == 0:
        unexpressed.append(_cannot(plan, "DeepSpeed without ZeRO", "(offload_optimizer needs ZeRO-1 or more)"))
        return
    zero = config["zero_optimization"]
    zero["offload_optimizer"] = dict(PINNED_CPU)
    if plan.offload == "full" and stage == 3:
        zero["offload_param"] = dict(PINNED_CPU)
    elif plan.offload == "full":
        unexpressed.append(
            f"offload=full at ZeRO-{stage}: DeepSpeed offloads parameters at stage 3 only; "
            "written as offload_optimizer."
        )
    config["zero_force_ds_cpu_optimizer"] = False
    unexpressed.append(
        f"offload={plan.offload}: priced with the profile's CPU Adam rate, which DeepSpeed's vectorised "
        "DeepSpeedCPUAdam (deepspeed.ops.adam) reaches; pass it as the optimizer, a torch optimizer steps slower."
    )


def torchtitan_training(plan: Plan, notes: list[str]) -> dict[str, Any]:
    """Entries of torchtitan's ``training`` section: FSDP2's CPU offload of parameters, gradients and optimizer."""
    if plan.offload == "full":
        return {"enable_cpu_offload": True}
    if plan.offload == "optimizer":
        notes.append(
            _cannot(
                plan,
                "torchtitan",
                "the optimizer alone (enable_cpu_offload offloads FSDP2's parameters, gradients and optimizer)",
            )
        )
    return {}


def megatron_flags(plan: Plan, notes: list[str]) -> list[tuple[str, Any]]:
    """Megatron-LM flags of its distributed optimizer's CPU offload (the whole of it: fraction 1.0)."""
    if plan.offload == "optimizer":
        # validate_args requires the precision-aware optimizer with the offload; its default dtypes are fp32
        # (master, gradients, moments: the 16 B per parameter priced on the host)
        return [
            ("--optimizer-cpu-offload", None),
            ("--optimizer-offload-fraction", 1.0),
            ("--use-precision-aware-optimizer", None),
        ]
    if plan.offload == "full":
        notes.append(
            _cannot(plan, "Megatron-LM", "parameters and gradients (only its optimizer, --optimizer-cpu-offload)")
        )
    return []


def accelerate_offload_params(plan: Plan, unexpressed: list[str]) -> bool:
    """Accelerate's ``fsdp_offload_params`` (FSDP2's CPUOffloadPolicy: parameters, gradients and optimizer)."""
    if plan.offload == "optimizer":
        unexpressed.append(
            _cannot(
                plan, "Accelerate's FSDP plugin", "the optimizer alone (fsdp_offload_params offloads parameters too)"
            )
        )
    return plan.offload == "full"


def read_offload(
    *, optimizer: bool, params: bool, zero_stage: int, unmapped: list[str], source: str, pp: int = 1, one_rank=False
) -> str:
    """The plan's offload from a config's switches (``source`` names them); one the executor cannot run
    (autoplan/types/offload.py) is left at "none" with a sentence in ``unmapped``. ``one_rank``: one dp rank,
    whose optimizer offload runs at ZeRO-0 (types/offload.py ``one_rank_offload``)."""
    wanted = "full" if params else "optimizer" if optimizer else "none"
    needs = {"none": zero_stage, "optimizer": 0 if one_rank else 1, "full": 3}[wanted]
    if zero_stage != needs or (wanted == "full" and pp > 1):
        where = f"ZeRO-{needs} without a pipeline" if wanted == "full" else f"ZeRO-{needs}"
        unmapped.append(
            f"{source}: autoplan runs CPU offload ({wanted}) on {where}, not on this config's ZeRO-{zero_stage}"
            f"{f' with pp={pp}' if pp > 1 else ''}; read as no offload."
        )
        return "none"
    return wanted


def torchtitan_offload(training: dict[str, Any], fields: dict[str, Any], *, pp: int, unmapped: list[str]) -> str:
    """torchtitan's ``training.enable_cpu_offload`` (FSDP2's CPUOffloadPolicy) as the plan's offload
    (:func:`read_offload`), ``fields`` the Plan fields read so far."""
    zero_stage = fields.get("zero_stage", 0)
    wanted = bool(training.get("enable_cpu_offload"))
    return read_offload(
        optimizer=False, params=wanted, zero_stage=zero_stage, unmapped=unmapped, source="enable_cpu_offload", pp=pp
    )


def megatron_offload(args: dict[str, Any], zero_stage: int, unmapped: list[str]) -> str:
    """The offload of Megatron-LM arguments: "optimizer" for ``--optimizer-cpu-offload`` of the whole
    optimizer (``--optimizer-offload-fraction`` 1, its default); a part of it is not priced (one sentence)."""
    if "--optimizer-cpu-offload" not in args:
        return "none"
    fraction = float(args.get("--optimizer-offload-fraction", 1.0))
    if fraction != 1.0:
        unmapped.append(f"--optimizer-offload-fraction {fraction:g}: autoplan prices the whole optimizer on the host "
                        "or none of it; read as no offload.")  # fmt: skip
        return "none"
    one_rank = zero_stage == 0 and "--use-distributed-optimizer" in args  # read as ZeRO-0 on one dp rank
    return read_offload(
        optimizer=True,
        params=False,
        zero_stage=zero_stage,
        unmapped=unmapped,
        source="--optimizer-cpu-offload",
        one_rank=one_rank,
    )
