"""Each data-parallel rank's buffers in a checkpoint (docs/elastic.md, "Checkpoints").

A forward may update buffers (BatchNorm's running statistics, a spectral norm's vectors, a running mean it reads),
and each dp rank updates its own copy: under FSDP2, ZeRO-1 and the explicit all-reduce they drift apart for good,
and under DDP rank 0's are broadcast before each step's first forward. ``model.<fqn>`` holds one copy of each
persistent buffer (whichever rank DCP let write it: rank 1's under DDP, so a resumed DDP run started from the
wrong rank's statistics, 1e-4 in the next loss), and no non-persistent one (a running buffer the forward reads
was lost on resume, 1e-3 to 4e-2 in the next losses, at one device too). Every buffer of every dp index is saved
as ``extra.buffers.dp<d>.<fqn>``, and a resume on the same world size gives each rank its dp index's; on another
world size the resumed run keeps the persistent buffers of ``model.<fqn>``, as before.
"""

from __future__ import annotations

from typing import Any

import torch

PREFIX = "extra.buffers."


def buffer_state(trainer: Any, tensors: dict, after_load: list, *, for_load: bool) -> None:
    """Add this rank's buffers to ``tensors`` under its dp index (module docstring); for a load, copies to read
    into, written into the buffers after it."""
    from autoplan.execute.job.verify import original_name

    index = trainer.mesh.get_local_rank("dp") if "dp" in (trainer.mesh.mesh_dim_names or ()) else 0
    for module in trainer.stage_modules.values():
        for name, buffer in module.named_buffers():
            key = f"{PREFIX}dp{index}.{original_name(name)}"
            if key in tensors:
                continue
            if not for_load:
                tensors[key] = buffer.detach()
                continue
            tensors[key] = buffer.detach().clone()
            after_load.append(lambda b=buffer, t=tensors[key]: _copy(b, t))


@torch.no_grad()
def _copy(buffer: torch.Tensor, loaded: torch.Tensor) -> None:
    buffer.copy_(loaded)
