"""The buffers each dp rank's forward reads, for --verify's reference (autoplan/execute/job/verify.py).

A model may update buffers in its forward (a spectral norm's power-iteration vectors, running statistics that
the forward also reads). In the run each dp rank updates its own copy over its own micro-batches; the reference
runs every rank's micro-batches in turn on one model, so without this it would carry one rank's updates into the
next rank's forward and compare another function (--verify failed a correct run at 0.4-0.7). Each dp rank keeps
its own buffers here, loaded before its micro-batches and kept after them, as the run's ranks keep theirs:
under FSDP2, ZeRO-1 and the explicit all-reduce nothing syncs them; under DDP (``forward_sync_buffers``) rank 0's
are broadcast before the first forward of each step, and not before a forward under ``no_sync`` (the other
micro-batches), so at each step's start every rank takes dp rank 0's.
"""

from __future__ import annotations

import torch
import torch.nn as nn


class RankBuffers:
    """Each dp rank's copy of the model's buffers (module docstring); nothing to do for a model without any."""

    def __init__(self, model: nn.Module, *, dp: int, synced_each_step: bool):
        self.dp, self.synced = dp, synced_each_step
        self.kept: list[dict[str, torch.Tensor]] | None = None
        self.any = dp > 1 and any(True for _ in model.buffers())

    def start_step(self, model: nn.Module) -> None:
        if not self.any:
            return
        if self.kept is None:
            self.kept = [_copy(model) for _ in range(self.dp)]
        elif self.synced:
            self.kept = [dict(self.kept[0]) for _ in range(self.dp)]

    def enter(self, model: nn.Module, rank: int) -> None:
        if self.any:
            with torch.no_grad():
                for name, buffer in model.named_buffers():
                    buffer.copy_(self.kept[rank][name])

    def leave(self, model: nn.Module, rank: int) -> None:
        if self.any:
            self.kept[rank] = _copy(model)


def _copy(model: nn.Module) -> dict[str, torch.Tensor]:
    return {name: buffer.detach().clone() for name, buffer in model.named_buffers()}
