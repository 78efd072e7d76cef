"""Mixed precision as ``plan.precision`` says: one :class:`PrecisionPolicy` per run, used by the
distributed step *and* by --verify's single-process reference, so both compute the same thing
(docs/executor.md, "Recomputation and precision").

Two policies, chosen by how the data parallelism is realised (``data_parallel.dp_mode``):

- ``cast_params`` (FSDP2, ZeRO 2/3): ``MixedPrecisionPolicy(param_dtype=bf16|fp16,
  reduce_dtype=fp32)``, ``cast_forward_inputs``: the whole forward and backward in the low dtype,
  gradients reduce-scattered in fp32 onto fp32 master shards (torchtitan's FSDP2 policy);
- ``autocast`` (DDP, explicit all-reduce, ZeRO-1, no dp): fp32 parameters and gradients,
  ``torch.autocast`` around the forward (and the pipeline schedule).

"fp8" follows bf16's policies. ``plan.grad_reduce_dtype`` is independent of the precision (FSDP2
then gets ``MixedPrecisionPolicy(param_dtype=None, reduce_dtype=bf16|fp16)``); fp16 adds dynamic
loss scaling in both (autoplan/execute/grad_scaler.py).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn
from torch.distributed.fsdp import MixedPrecisionPolicy

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
#: the dtype everything but the FP8 GEMMs computes in, per plan precision
COMPUTE_DTYPES = {**DTYPES, "fp8": torch.bfloat16}


@dataclass(frozen=True)
class PrecisionPolicy:
    """How one run computes: in ``compute_dtype``, by casting parameters or by autocast."""

    name: str  # plan.precision: fp32 | bf16 | fp16 | fp8
    cast_params: bool  # parameters (and floating inputs) cast to compute_dtype; no autocast
    reduce_dtype: torch.dtype = torch.float32

    @property
    def compute_dtype(self) -> torch.dtype:
        return COMPUTE_DTYPES[self.name]

    @property
    def low(self) -> bool:
        return self.name != "fp32"

    @property
    def scales_loss(self) -> bool:
        """fp16's 5 exponent bits underflow small gradients: scale the loss (grad_scaler.py)."""
        return self.name == "fp16"


def policy_for(*, precision: str, dp_mode: str, reduce_dtype: str = "fp32") -> PrecisionPolicy:
    """The policy of a run: FSDP2 casts parameters, every other dp mode uses autocast;
    data-parallel gradients are reduced in ``reduce_dtype`` (``plan.grad_reduce_dtype``)."""
    return PrecisionPolicy(
        name=precision, cast_params=precision != "fp32" and dp_mode == "fsdp", reduce_dtype=DTYPES[reduce_dtype]
    )


def mp_policy(policy: PrecisionPolicy) -> MixedPrecisionPolicy | None:
    """FSDP2's MixedPrecisionPolicy: parameters cast to the compute dtype under cast_params,
    gradients reduced in the policy's reduce dtype; None when neither differs from fp32."""
    if not policy.cast_params and policy.reduce_dtype == torch.float32:
        return None
    return MixedPrecisionPolicy(
        param_dtype=policy.compute_dtype if policy.cast_params else None, reduce_dtype=policy.reduce_dtype
    )


def autocast(policy: PrecisionPolicy, *, device_type: str):
    """The forward context in low precision (else nothing): autocast to the compute dtype.

    Under cast_params (FSDP2) the parameters are already low, so autocast only reconciles ops
    whose inputs mix dtypes because a floating *buffer* FSDP2 does not cast (rotary tables,
    masks: ``q * cos`` is fp32 while ``v`` is bf16, and attention refuses mixed dtypes)."""
    if not policy.low:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device_type, dtype=policy.compute_dtype)


def cast_parameters(model: nn.Module, policy: PrecisionPolicy) -> nn.Module:
    """Under a cast_params policy, cast every parameter of ``model`` to the compute dtype in
    place (what FSDP2 computes with); buffers keep their dtype, as under FSDP2."""
    if policy.cast_params:
        for param in model.parameters():
            param.data = param.data.to(policy.compute_dtype)
    return model


def cast_inputs(obj: Any, policy: PrecisionPolicy) -> Any:
    """Floating tensors in ``obj`` cast to the compute dtype (FSDP2's cast_forward_inputs)."""
    if not policy.cast_params:
        return obj
    if isinstance(obj, torch.Tensor):
        return obj.to(policy.compute_dtype) if obj.is_floating_point() else obj
    if isinstance(obj, (tuple, list)):
        return type(obj)(cast_inputs(o, policy) for o in obj)
    if isinstance(obj, dict):
        return {k: cast_inputs(v, policy) for k, v in obj.items()}
    return obj
