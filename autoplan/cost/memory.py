"""Memory per device: model states as the executor holds them, activations in flight, buffers.

Model states per parameter on a device (after tensor-parallel sharding), by how the executor
realises the plan's data parallelism (autoplan/execute/data_parallel.py), with N dp ranks:

    executor                         weights                      grads        optimizer (AdamW)
    DDP / all-reduce (ZeRO-0)        4 (+2 low copy)              4            8
    ZeRO-1 (execute/zero.py)         4 (+2 low copy)              4            12 / N  (fp32 master slice 4 + moments 8)
    FSDP2, ZeRO-2                    4/N + b (gathered for the step)  4/N      8 / N
    FSDP2, ZeRO-3                    4/N (+ two gathered blocks, buffers)  4/N  8 / N

Parameters stay fp32 outside FSDP2 and autocast computes in bf16/fp16, caching a low-precision
copy of every weight it casts (2 bytes, alive from the forward to the backward); gradients are
fp32 (the role of Megatron-LM's fp32 main-gradient buffer). Under FSDP2 the fp32 shards are the
master weights and the gathered ones are in the compute dtype b. Totals match Rajbhandari et
al., "ZeRO", SC'20 section 3 (16 bytes per parameter in mixed precision, 16/N under ZeRO-3);
the split differs because the executor keeps fp32 parameters rather than 16-bit ones plus an
fp32 master copy.

Activations: the stage's saved bytes per micro-batch (autoplan/cost/layers.py) times the
micro-batches in flight (autoplan/cost/schedule.py). Under full recomputation only the block
inputs are kept per micro-batch, plus one block's full activations while it is recomputed
and back-propagated.

Communication buffers: DDP's buckets are the gradients themselves (``gradient_as_bucket_view``),
so none; the explicit all-reduce and ZeRO-1 flatten the gradients once a step after the
backward (one gradient-sized buffer, when the activations are gone: it counts only if that
moment is the peak); the pipeline's send and receive buffers (2 boundary activations); under
ZeRO-3 the gathered weights of two blocks (the running one and the prefetched one, FSDP) plus
one block's unsharded gradients before the reduce-scatter.

A plan fits when the peak of the most loaded stage is at most ``(1 - ALLOCATOR_HEADROOM)``
of the device memory: the PyTorch caching allocator's fragmentation, the CUDA context and
library workspaces take the rest (10% is the headroom DeepSpeed's and Megatron's memory
estimators leave in practice; a documented constant, not fitted to any run).
"""
from __future__ import annotations

from dataclasses import dataclass

ALLOCATOR_HEADROOM = 0.10
DDP_BUCKET_BYTES = 25 * 2**20
#: (weights, grads, optimizer) bytes per parameter in the textbook split, Rajbhandari et al. SC'20
#: section 3; the planner's lower bounds (solve/bounds.py) use it: it never exceeds model_states
STATE_BYTES = {"fp32": (4, 4, 8), "bf16": (2, 2, 12), "fp16": (2, 2, 12)}
#: the low-precision copy autocast keeps of each fp32 weight (module docstring)
LOW_BYTES = {"fp32": 0, "bf16": 2, "fp16": 2}


@dataclass(frozen=True)
class ModelStates:
    weights_bytes: float
    grads_bytes: float
    optimizer_bytes: float


def model_states(*, params: float, precision: str, zero_stage: int, dp: int) -> ModelStates:
    """Model-state bytes for ``params`` parameters on one device, as the executor holds them
    (module docstring)."""
    low = LOW_BYTES[precision]
    if dp > 1 and zero_stage >= 2:   # FSDP2: fp32 shards; ZeRO-2 keeps the compute-dtype weights gathered
        gathered = params * (low or 4) if zero_stage == 2 else 0.0
        return ModelStates(weights_bytes=4 * params / dp + gathered, grads_bytes=4 * params / dp, optimizer_bytes=8 * params / dp)
    optimizer = 12 * params / dp if zero_stage == 1 and dp > 1 else 8 * params
    return ModelStates(weights_bytes=(4 + low) * params, grads_bytes=4 * params, optimizer_bytes=optimizer)


def comm_buffer_bytes(*, zero_stage: int, dp: int, pp: int, boundary_bytes: float, block_params: float, precision: str) -> float:
    """Bytes of communication buffers on one device during the forward and backward (module
    docstring); the gradient flattening after the backward is :func:`sync_buffer_bytes`."""
    weight_bytes = LOW_BYTES[precision] or 4
    total = 0.0
    if zero_stage >= 3 and dp > 1:
        total += block_params * (2 * weight_bytes + 4)
    if pp > 1:
        total += 2 * boundary_bytes
    return total


def sync_buffer_bytes(*, params: float, zero_stage: int, dp: int, tp: int, pp: int, reduce_bytes: int) -> float:
    """The flat gradient buffer of the explicit all-reduce (ZeRO-0 under tp or pp) and of ZeRO-1,
    alive after the backward; DDP reduces in place and FSDP2 per block."""
    if dp == 1 or zero_stage >= 2 or (zero_stage == 0 and tp == 1 and pp == 1):
        return 0.0
    return params * max(4, reduce_bytes)


def usable_bytes(memory_bytes: float) -> float:
    """Device memory a plan may use: all of it less the allocator headroom."""
    return memory_bytes * (1.0 - ALLOCATOR_HEADROOM)
