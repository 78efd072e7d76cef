"""Each data-parallel rank's buffers in a checkpoint (docs/elastic.md, "Checkpoints").

A forward may update buffers (BatchNorm's running statistics, a spectral norm's vectors, a running mean it reads),
and each dp rank updates its own copy: under FSDP2, ZeRO-1 and the explicit all-reduce they drift apart for good,
and under DDP rank 0's are broadcast before each step's first forward. ``model.<fqn>`` holds one copy of each
persistent buffer (whichever rank DCP let write it: rank 1's under DDP, so a resumed DDP run started from the
wrong rank's statistics, 1e-4 in the next loss), and no non-persistent one (a running buffer the forward reads
was lost on resume, 1e-3 to 4e-2 in the next losses, at one device too).

Every buffer of dp index 0 is saved as ``extra.buffers.dp0.<fqn>``; a buffer of dp index d > 0 as
``extra.buffers.dp<d>.<fqn>`` only where it differs from dp index 0's (compared at the save, one broadcast per
buffer over the dp group), and never under DDP, whose next forward gives every rank dp index 0's: a constant buffer
(a causal mask, a rotary table) is written once, not once per dp rank. A resume on the same world size gives each
rank its dp index's copy where the checkpoint holds one, else dp index 0's; on another world size the resumed run
keeps the persistent buffers of ``model.<fqn>``, as before.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

PREFIX = "extra.buffers."


def buffer_state(trainer: Any, tensors: dict, after_load: list, *, for_load: bool) -> None:
    """Add this rank's buffers to ``tensors`` (module docstring); for a load, copies to read into, written into the
    buffers after it: dp index 0's first, then this rank's own where the checkpoint holds it."""
    from autoplan.execute.job.verify import original_name

    index = trainer.mesh.get_local_rank("dp")
    named = {}
    for module in trainer.stage_modules.values():
        for name, buffer in module.named_buffers():
            named.setdefault(original_name(name), buffer)
    if for_load:
        for index_read in dict.fromkeys((0, index)):
            for name, buffer in named.items():
                key = f"{PREFIX}dp{index_read}.{name}"
                tensors[key] = buffer.detach().clone()
                after_load.append(lambda b=buffer, k=key: k in tensors and _copy(b, tensors[k]))
        return
    ddp = trainer.dp_mode == "ddp"
    if index > 0 and ddp:
        return
    differs = _differs_from_dp0(trainer, named) if trainer.mesh["dp"].size() > 1 and not ddp else {}
    for name, buffer in named.items():
        if index == 0 or differs[name]:
            tensors[f"{PREFIX}dp{index}.{name}"] = buffer.detach()


def _differs_from_dp0(trainer: Any, named: dict[str, torch.Tensor]) -> dict[str, bool]:
    """Which of this rank's buffers differ from dp index 0's: a broadcast per buffer over the dp group, which every
    rank of the group makes, dp index 0 as the source. A DTensor buffer is taken as differing."""
    group = trainer.mesh["dp"].get_group()
    source = dist.get_global_rank(group, 0)
    found = {}
    for name, buffer in named.items():
        if isinstance(buffer, DTensor):
            found[name] = True
            continue
        theirs = buffer.detach().clone()
        dist.broadcast(theirs, src=source, group=group)
        found[name] = not torch.equal(theirs, buffer)
    return found


@torch.no_grad()
def _copy(buffer: torch.Tensor, loaded: torch.Tensor) -> None:
    buffer.copy_(loaded)
