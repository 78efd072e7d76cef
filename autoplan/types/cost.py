"""The cost model's prediction for one plan: where the time and the memory go.

Times are seconds per training step (one global batch); memory is bytes on the most loaded
device. ``step_time_s`` is not the plain sum of the time fields: the cost model states how
they combine (overlap) in docs/cost-model.md.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class Cost:
    # step time, seconds
    compute_s: float = 0.0  # forward + backward (+ recomputed forward) of the slowest stage
    recompute_s: float = 0.0  # the part of compute_s spent re-running the forward
    tp_comm_s: float = 0.0  # tensor/sequence-parallel collectives on the critical path
    ep_comm_s: float = 0.0  # expert-parallel all-to-all (MoE dispatch and combine) on the critical path
    cp_comm_s: float = 0.0  # context-parallel key/value exchange in attention, exposed beside its compute
    dp_comm_s: float = 0.0  # data-parallel gradient sync, total
    dp_comm_exposed_s: float = 0.0  # the part of dp_comm_s not hidden under the backward pass
    compression_s: float = 0.0  # gradient compression's own work (PowerSGD's matmuls, error feedback)
    zero_comm_s: float = 0.0  # ZeRO-3 parameter all-gathers and gradient reduce-scatters (exposed)
    pp_comm_s: float = 0.0  # pipeline send/recv on the critical path, and tied-weight gradient sync
    bubble_s: float = 0.0  # pipeline fill and drain
    grad_accum_s: float = 0.0  # adding each micro-batch's weight gradients into the held ones
    optimizer_s: float = 0.0  # optimizer step
    step_time_s: float = 0.0
    # memory per device, bytes (the most loaded device)
    weights_bytes: int = 0
    grads_bytes: int = 0
    optimizer_bytes: int = 0
    activations_bytes: int = 0
    comm_buffer_bytes: int = 0
    peak_memory_bytes: int = 0
    memory_capacity_bytes: int = 0
    # throughput
    samples_per_s: float = 0.0
    tokens_per_s: float | None = None
    mfu: float = 0.0
    cost_per_step_usd: float | None = None
    feasible: bool = True
    reason: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    TIME_FIELDS = (
        "compute_s",
        "tp_comm_s",
        "ep_comm_s",
        "cp_comm_s",
        "dp_comm_exposed_s",
        "compression_s",
        "zero_comm_s",
        "pp_comm_s",
        "bubble_s",
        "grad_accum_s",
        "optimizer_s",
    )
    MEMORY_FIELDS = ("weights_bytes", "grads_bytes", "optimizer_bytes", "activations_bytes", "comm_buffer_bytes")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Cost":
        return cls(**data)
