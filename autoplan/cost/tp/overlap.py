"""Tensor-parallel communication hidden under the matmuls beside it (``plan.tp_comm_overlap``).

Under sequence parallelism each split matmul has a collective beside it: the all-gather of its
sequence-sharded input before a colwise matmul, the reduce-scatter of its partial output after
a rowwise one, mirrored in the backward (Korthikanti et al. 2022, fig. 5). Overlap decomposes
both into ``n = tp`` steps: while step k's slice of the collective moves (a peer-to-peer copy of
one rank's shard), the matmul computes on the slice already there (Wang et al., ASPLOS'23,
"Overlap Communication with Dependent Computation via Decomposition"; PyTorch's async tensor
parallelism, ``fused_all_gather_matmul`` / ``fused_matmul_reduce_scatter``; Megatron-Core's
``--tp-comm-overlap``). With ``c = C / n`` of the block's collective time ``C`` and ``g = G / n``
of its split matmuls' time ``G`` per step, the two-stage pipeline takes
``c + (n - 1) max(c, g) + g``, so the collective time left exposed is

    exposed_1 = c + (n - 1) max(0, c - g)

(the first slice always shows; later ones show only where a slice of communication outlasts a
slice of matmul). A collective that runs beside compute hides only the fraction ``eta`` of what
it could (profile ``comm_overlap.efficiency``, measured by ``autoplan profile`` as for data
parallelism; autoplan/cost/pp/schedule.py:partially_hidden_s):

    exposed = exposed_1 + (1 - eta) (C - exposed_1)

The decomposition has a price of its own: each split matmul runs as ``n`` matmuls on ``1/n`` of
the tokens, whose time comes from the same efficiency curve as every op
(autoplan/cost/compute/roofline.py:op_time_s), ``n t(F / n) - t(F)`` more per matmul; the block's summary
carries it (``tp_overlap_chunking_*_s``) and it is added to the block's compute. The block-level
pairing (all of a block's collectives against all of its split matmuls) assumes each collective
sits beside a matmul of its block, which sequence parallelism guarantees for transformer blocks.
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
