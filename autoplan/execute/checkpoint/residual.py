"""Top-k's error-feedback residuals in a checkpoint (autoplan/execute/topk_hook.py; docs/elastic.md,
"Checkpoints"). Each rank's residual is its own (what it has not sent yet), so it is saved per rank as
``extra.topk.rank<r>.<fqn>``, like the RNG states, and restored only where the world size is unchanged
and the plan runs the hook; elsewhere the resumed run starts its residuals at 0.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn

PREFIX = "extra.topk."


def residual_state(trainer: Any, named: dict[str, torch.Tensor], tensors: dict, after_load: list, *, for_load: bool):
    """Add this rank's residuals to ``tensors`` (for a load: zeros to read into, handed to the hook after)."""
    hook = getattr(trainer.model, "topk_state", None)
    if hook is None:
        return
    rank = dist.get_rank() if dist.is_initialized() else 0
    for name, param in named.items():
        if not isinstance(param, nn.Parameter) or not param.requires_grad:
            continue
        held = hook.residual_of(param)
        if held is None and not for_load:
            continue  # no step yet: nothing to keep
        key = f"{PREFIX}rank{rank}.{name}"
        if not for_load:
            tensors[key] = held.detach()
            continue
        tensors[key] = torch.zeros(param.shape, dtype=torch.float32, device=param.device)
        after_load.append(lambda p=param, t=tensors[key]: hook.restore(p, t))


def per_rank(key: str) -> bool:
    """A key only the same world size can restore (the RNG states, the residuals, each dp index's buffers)."""
    return key.startswith(("rng.", PREFIX, "extra.buffers."))
