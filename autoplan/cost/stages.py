"""Per-stage totals of a plan: block summaries summed over the blocks each pipeline stage runs.

Chunk ``c`` of ``plan.stages`` (``pp * virtual_stages`` chunks) runs on stage ``c % pp``
(Narayanan et al. SC'21 section 2.2.2). Nodes outside every block go to the first stage when
they run before the first block (embeddings) and to the last stage otherwise (final norm,
head, loss), as docs/architecture.md fixes. Recomputation (autoplan/cost/layers.py) applies to
blocks only.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from autoplan.cost.layers import LayerSummary


@dataclass
class StageTotals:
    """One pipeline stage, per micro-batch (times) or per device (parameters)."""

    fwd_s: float = 0.0
    bwd_s: float = 0.0
    recompute_s: float = 0.0
    tp_s: float = 0.0
    saved_bytes: float = 0.0       # activations kept per micro-batch after the recompute choice
    peak_block_bytes: float = 0.0  # one block's full activations (live while it is recomputed)
    params: float = 0.0
    flops: float = 0.0
    blocks: list[LayerSummary] = field(default_factory=list)   # in forward order, outside nodes included
    boundary_bytes: float = 0.0    # activation received from the previous stage, per micro-batch

    @property
    def micro_batch_s(self) -> float:
        """Forward + backward + recompute + TP collectives of one micro-batch on this stage."""
        return self.fwd_s + self.bwd_s + self.recompute_s + self.tp_s

    @property
    def compute_s(self) -> float:
        return self.fwd_s + self.bwd_s + self.recompute_s


def add_block(stage: StageTotals, block: LayerSummary, *, recompute: str, is_block: bool = True) -> None:
    """Add one block (or the outside nodes, ``is_block=False``) to ``stage``."""
    stage.fwd_s += block.fwd_s
    stage.bwd_s += block.bwd_s
    stage.tp_s += block.tp_fwd_s + block.tp_bwd_s
    stage.params += block.param_count
    stage.flops += block.flops
    stage.blocks.append(block)
    if not is_block or recompute == "none":
        stage.saved_bytes += block.saved_bytes
        return
    if recompute == "selective":   # everything but matmul-class ops re-runs, the TP collectives too
        stage.recompute_s += block.selective_recompute_s
        stage.tp_s += block.tp_fwd_s
        stage.saved_bytes += block.saved_bytes - block.selective_dropped_bytes
        return
    stage.recompute_s += block.fwd_s
    stage.tp_s += block.tp_fwd_s
    stage.saved_bytes += block.input_bytes
    stage.peak_block_bytes = max(stage.peak_block_bytes, block.saved_bytes)
