"""A recomputed block re-runs on the buffers its forward found, and leaves them as they are (docs/executor.md,
"Recomputation and precision", buffers a forward updates).

torch's checkpoint re-runs a block's forward in the backward. A forward that updates buffers in place (a spectral
norm's power-iteration vectors, BatchNorm's running statistics, a running mean it subtracts) updated them again in
each re-run, and a re-run that reads them (the spectral norm's weight) rebuilt other tensors than its forward had
made: gradients 9-22% off those without recomputation (tests/odd_models/buffer_updates.py at dp = 2), and
BatchNorm's statistics moved twice a step. :class:`BuffersAsFound`, made around each call of a checkpointed block,
keeps a copy of the block's buffers as the call found them and, once the forward has run, only of the buffers of
each module whose forward changed one (a version counter moved: BatchNorm's kernel updates its running statistics
without moving theirs, but its ``num_batches_tracked`` moves). Each re-run swaps a fresh copy of those in
(``.data``, outside the checkpoint's dispatch modes) and, when it ends, swaps back what the buffers held before it:
the re-run's updates are dropped. A block without buffers, or whose forward changes none, re-runs as before.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
import torch.nn as nn
from torch.utils._python_dispatch import _disable_current_modes


class BuffersAsFound:
    """One call of a checkpointed block (module docstring): :meth:`wrap` its forward for the checkpoint, and call
    :meth:`forward_done` when the checkpoint returns."""

    def __init__(self, module: nn.Module) -> None:
        held = [(owner, b) for owner in module.modules() for b in owner._buffers.values() if b is not None]
        with torch.no_grad(), _disable_current_modes():
            self._found = [(owner, b, b._version, b.detach().clone()) for owner, b in held]
        self._changed: list[tuple[torch.Tensor, torch.Tensor]] = []
        self._ran = False

    def wrap(self, forward: Callable) -> Callable:
        """``forward`` for the checkpoint: its first call is the forward, each later one a re-run."""

        def call(*args: Any, **kwargs: Any) -> Any:
            if not self._ran:
                self._ran = True
                return forward(*args, **kwargs)
            if not self._changed:
                return forward(*args, **kwargs)
            with torch.no_grad(), _disable_current_modes():
                held = [(buffer, buffer.data) for buffer, _ in self._changed]
                for buffer, value in self._changed:
                    buffer.data = value.clone()
            try:
                return forward(*args, **kwargs)
            finally:
                for buffer, value in held:
                    buffer.data = value

        return call

    def forward_done(self) -> None:
        """Keep the copies of the buffers of each module whose forward changed one (module docstring); drop the
        others."""
        changed = {id(owner) for owner, b, version, _ in self._found if b._version != version}
        self._changed = [(b, found) for owner, b, _, found in self._found if id(owner) in changed]
        self._found = []
