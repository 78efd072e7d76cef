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
    if device_type == "cpu":
        keep_rnns_off_onednn_without_kernels(policy.compute_dtype)
    cast = torch.autocast(device_type=device_type, dtype=policy.compute_dtype)
    return _Stacked(cast, NormParamsLikeStatistics()) if policy.cast_params else cast


class _Stacked(contextlib.ExitStack):
    """Several contexts entered as one (a fresh stack each time the context is built)."""

    def __init__(self, *contexts: Any):
        super().__init__()
        self.contexts = contexts

    def __enter__(self):
        super().__enter__()
        for context in self.contexts:
            self.enter_context(context)
        return self


class NormParamsLikeStatistics(torch.overrides.TorchFunctionMode):
    """Under cast_params, a batch norm's weight and bias in its running statistics' dtype (fp32).

    FSDP2 casts a BatchNorm's weight and bias to bf16 and leaves its running mean and variance, buffers, in fp32,
    and batch_norm refuses the mix ("expected scalar type BFloat16 but found Float": every ResNet and U-Net under
    ZeRO-2/3 in bf16 stopped at its first step). Cast up, the call is batch_norm's mixed-precision form (a bf16
    input with fp32 parameters and statistics, a bf16 output), as FSDP1 kept batch norms in fp32; the gradients
    flow back through the cast to the bf16 parameters FSDP2 reduces."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _BATCH_NORMS:
            args, kwargs = _params_like_statistics(func, args, kwargs)
        return func(*args, **kwargs)


#: each batch norm's positional order up to the bias: F.batch_norm(input, running_mean, running_var, weight, bias, ...),
#: and the ATen binding torch.batch_norm(input, weight, bias, running_mean, running_var, ...) that model code may call
_BATCH_NORMS = {
    torch.nn.functional.batch_norm: ("input", "running_mean", "running_var", "weight", "bias"),
    torch.batch_norm: ("input", "weight", "bias", "running_mean", "running_var"),
}


def _params_like_statistics(func: Any, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    order = _BATCH_NORMS[func]
    named = dict(zip(order, args))
    named.update({k: v for k, v in kwargs.items() if k in ("running_mean", "weight", "bias")})
    stats = named.get("running_mean")
    if not isinstance(stats, torch.Tensor):
        return args, kwargs
    args = list(args)
    for index, name in ((order.index("weight"), "weight"), (order.index("bias"), "bias")):
        value = named.get(name)
        if isinstance(value, torch.Tensor) and value.dtype != stats.dtype:
            if name in kwargs:
                kwargs = {**kwargs, name: value.to(stats.dtype)}
            else:
                args[index] = value.to(stats.dtype)
    return tuple(args), kwargs


#: whether oneDNN has this CPU's kernels for a low dtype (torch's checks of the ISA: bf16 needs
#: AVX-512 BW/VL/DQ, fp16 AVX-512 FP16 or AMX-FP16)
_ONEDNN_HAS = {
    torch.bfloat16: lambda: torch.ops.mkldnn._is_mkldnn_bf16_supported(),
    torch.float16: lambda: torch.ops.mkldnn._is_mkldnn_fp16_supported(),
}


def keep_rnns_off_onednn_without_kernels(dtype: torch.dtype) -> bool:
    """Turn oneDNN off for this process where CPU autocast would hand it an RNN in a dtype this CPU
    has no oneDNN kernel for; returns whether it did.

    torch picks oneDNN for an LSTM/GRU/RNN by the dtype of the input it is given (fp32 under
    autocast; aten/src/ATen/native/RNN.cpp ``use_mkldnn``), and autocast then casts oneDNN's RNN layer
    (``mkldnn_rnn_layer``, on CPU autocast's low-precision list) to ``dtype``. Without a kernel,
    oneDNN "could not create a primitive descriptor for the LSTM forward propagation primitive" (seen
    on AVX2-only CPUs under bf16, and on this AVX-512 one under fp16). With oneDNN off, torch runs its
    native RNN, which autocast leaves in fp32, and the other ops keep the dtype checks they already
    make. Off for the rest of the process, not only inside one context: recomputation re-runs a
    forward during the backward, and the pipeline runs halves on other threads. Off whether or not the
    model has an RNN (the model is not known here): fp32 convolutions then leave oneDNN too."""
    has_kernels = _ONEDNN_HAS.get(dtype)
    if has_kernels is None or not torch.backends.mkldnn.is_available() or has_kernels():
        return False
    torch.backends.mkldnn.enabled = False
    return True


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
