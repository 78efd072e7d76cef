"""Mixed precision as ``plan.precision`` says.

- Under FSDP2: ``MixedPrecisionPolicy(param_dtype=bf16|fp16, reduce_dtype=fp32)``: params are
  all-gathered in low precision, gradients reduced in fp32, master weights stay fp32.
- Otherwise: ``torch.autocast`` around forward (and the pipeline schedule), fp32 weights.
- fp16 without FSDP scales the loss with ``torch.amp.GradScaler`` (no pipeline: the schedule
  owns backward there, so fp16 + pipeline runs unscaled; prefer bf16).
"""
from __future__ import annotations

import contextlib

import torch
from torch.distributed.fsdp import MixedPrecisionPolicy

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def mp_policy(*, precision: str) -> MixedPrecisionPolicy | None:
    if precision == "fp32":
        return None
    return MixedPrecisionPolicy(param_dtype=DTYPES[precision], reduce_dtype=torch.float32)


def autocast(*, precision: str, device_type: str, use_fsdp: bool):
    """The forward context: autocast unless fp32 or FSDP already casts."""
    if precision == "fp32" or use_fsdp:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device_type, dtype=DTYPES[precision])


def grad_scaler(*, precision: str, device_type: str, use_fsdp: bool, pipelined: bool):
    """A GradScaler for fp16 where we own backward; else None."""
    if precision != "fp16" or use_fsdp or pipelined:
        return None
    return torch.amp.GradScaler(device_type)
