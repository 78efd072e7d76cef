"""Tensor-parallel communication hidden under the matmuls beside it (``plan.tp_comm_overlap``;
docs/cost-model.md, "Step time", TP communication overlap).

Under sequence parallelism each split matmul has an all-gather before it (colwise) or a
reduce-scatter after it (rowwise), mirrored in the backward (Korthikanti et al. 2022, fig. 5).
Overlap decomposes both into ``n = tp`` steps (Wang et al., ASPLOS'23, "Overlap Communication with
Dependent Computation via Decomposition"; PyTorch's async TP; Megatron-Core's
``--tp-comm-overlap``): with ``c = C / n`` of the block's collective time ``C`` and ``g = G / n`` of
its split matmuls' time ``G``, the two-stage pipeline takes ``c + (n - 1) max(c, g) + g``, so

    exposed_1 = c + (n - 1) max(0, c - g)
    exposed   = exposed_1 + (1 - eta) (C - exposed_1)      eta: profile comm_overlap.efficiency
    chunking  = n t(F / n) - t(F)  per split matmul        added to the block's compute (op_time_s)
"""

from __future__ import annotations

from dataclasses import replace

from autoplan.cost.blocks import LayerSummary
from autoplan.cost.pp.schedule import partially_hidden_s


def exposed_tp_s(*, comm_s: float, matmul_s: float, tp: int, efficiency: float) -> float:
    """The collective time of the module docstring's decomposition left exposed."""
    if comm_s <= 0.0 or tp <= 1:
        return comm_s
    c, g = comm_s / tp, matmul_s / tp
    perfect = min(comm_s, c + (tp - 1) * max(0.0, c - g))
    return partially_hidden_s(exposed_s=perfect, total_s=comm_s, efficiency=efficiency)


def overlapped(block: LayerSummary, *, tp: int, efficiency: float) -> LayerSummary:
    """``block`` as it runs with tp_comm_overlap: collectives partly hidden, matmuls decomposed."""
    return replace(
        block,
        tp_fwd_s=exposed_tp_s(comm_s=block.tp_fwd_s, matmul_s=block.tp_matmul_fwd_s, tp=tp, efficiency=efficiency),
        tp_bwd_s=exposed_tp_s(comm_s=block.tp_bwd_s, matmul_s=block.tp_matmul_bwd_s, tp=tp, efficiency=efficiency),
        fwd_s=block.fwd_s + block.tp_overlap_chunking_fwd_s,
        bwd_s=block.bwd_s + block.tp_overlap_chunking_bwd_s,
    )
