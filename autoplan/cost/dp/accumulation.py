"""Gradient accumulation across micro-batches: the pass each micro-batch after the first makes over its
stage's gradients (docs/cost-model.md, "Gradient accumulation by runtime").

A runtime that does not fuse accumulation makes one memory-bound pass per micro-batch: it reads the
buffer and the new gradient and writes the buffer, ``3 b P`` bytes for ``P`` parameters in a buffer
of ``b`` bytes per element. The buffer's dtype is the runtime's (``Runtime.buffer_dtype``):
autoplan's executor and DeepSpeed accumulate in fp32 (b = 4); Megatron accumulates into main_grad,
in the reduce dtype unless ``grad_reduce_in_fp32`` (Megatron-LM arguments.py). A runtime with
``--gradient-accumulation-fusion`` has the weight-gradient GEMM accumulate into main_grad itself
(Megatron-LM fused_weight_gradient_dense, NVIDIA/Megatron-LM 83b1e42): no pass, 0 bytes.
Megatron-LM until 2022-09 fused only into an fp32 buffer (``Runtime.fusion_needs_fp32_buffer``).
"""

from __future__ import annotations

from autoplan.cost.compute.roofline import PRECISION_BYTES, memory_time_s
from autoplan.types.plan import Plan
from autoplan.types.profile import Profile


def accumulation_bytes_per_param(plan: Plan) -> float:
    """Bytes one micro-batch's accumulation pass moves per parameter under ``plan``'s runtime
    (module docstring): 0 when fused, else 3 b."""
    runtime = plan.runtime_preset
    if runtime.fuses_accumulation(plan.grad_reduce_dtype):
        return 0.0
    return 3.0 * PRECISION_BYTES[runtime.buffer_dtype(plan.grad_reduce_dtype)]


def accumulate_s(profile: Profile, plan: Plan, trainable_params: float) -> float:
    """One micro-batch's gradient accumulation over a stage's ``trainable_params``: read both gradients, write
    one, in the runtime's buffer dtype (:func:`accumulation_bytes_per_param`); none where the runtime fuses it
    into the wgrad GEMM."""
    return memory_time_s(profile, accumulation_bytes_per_param(plan) * trainable_params)
