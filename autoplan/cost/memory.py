"""Memory per device: model states under ZeRO, activations in flight, communication buffers.

Model states (Rajbhandari et al., "ZeRO", SC'20, section 3): with Psi parameters on a device
(after tensor-parallel sharding) and N data-parallel ranks, bytes per parameter are

    precision        weights  grads  optimizer (Adam)
    bf16 / fp16      2        2      12  (fp32 master weights 4 + momentum 4 + variance 4)
    fp32             4        4       8  (momentum 4 + variance 4)

ZeRO-1 divides the optimizer states by N, ZeRO-2 also the gradients, ZeRO-3 also the weights
(16 Psi / N in mixed precision).

Activations: the stage's saved bytes per micro-batch (autoplan/cost/layers.py) times the
micro-batches in flight (autoplan/cost/schedule.py). Under full recomputation only the block
inputs are kept per micro-batch, plus one block's full activations while it is recomputed
and back-propagated.

Communication buffers: data-parallel gradient buckets (2 in flight, PyTorch DDP's
``bucket_cap_mb`` = 25 MB each), the pipeline's send and receive buffers (2 boundary
activations), and under ZeRO-3 the gathered weights of two blocks (the running one and the
prefetched one, FSDP) plus one block's unsharded gradients before the reduce-scatter.

A plan fits when the peak of the most loaded stage is at most ``(1 - ALLOCATOR_HEADROOM)``
of the device memory: the PyTorch caching allocator's fragmentation, the CUDA context and
library workspaces take the rest (10% is the headroom DeepSpeed's and Megatron's memory
estimators leave in practice; a documented constant, not fitted to any run).
"""
from __future__ import annotations

from dataclasses import dataclass

ALLOCATOR_HEADROOM = 0.10
DDP_BUCKET_BYTES = 25 * 2**20
#: (weights, grads, optimizer) bytes per parameter, Rajbhandari et al. SC'20 section 3.
STATE_BYTES = {"fp32": (4, 4, 8), "bf16": (2, 2, 12), "fp16": (2, 2, 12)}


@dataclass(frozen=True)
class ModelStates:
    weights_bytes: float
    grads_bytes: float
    optimizer_bytes: float


def model_states(*, params: float, precision: str, zero_stage: int, dp: int) -> ModelStates:
    """ZeRO model-state bytes for ``params`` parameters on one device (module docstring)."""
    weights, grads, optimizer = (params * b for b in STATE_BYTES[precision])
    if zero_stage >= 1:
        optimizer /= dp
    if zero_stage >= 2:
        grads /= dp
    if zero_stage >= 3:
        weights /= dp
    return ModelStates(weights_bytes=weights, grads_bytes=grads, optimizer_bytes=optimizer)


def comm_buffer_bytes(*, zero_stage: int, dp: int, pp: int, boundary_bytes: float, block_params: float, precision: str) -> float:
    """Bytes of communication buffers on one device (module docstring)."""
    weight_bytes, grad_bytes, _ = STATE_BYTES[precision]
    total = 0.0
    if dp > 1 and zero_stage < 3:
        total += 2 * DDP_BUCKET_BYTES
    if zero_stage >= 3 and dp > 1:
        total += block_params * (2 * weight_bytes + grad_bytes)
    if pp > 1:
        total += 2 * boundary_bytes
    return total


def usable_bytes(memory_bytes: float) -> float:
    """Device memory a plan may use: all of it less the allocator headroom."""
    return memory_bytes * (1.0 - ALLOCATOR_HEADROOM)
