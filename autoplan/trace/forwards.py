"""Run a model with some submodules' ``forward`` replaced, and put the originals back after.

The tracer sizes loop-written MoE layers this way (trace/moe_loop.py) and the pipeline split
exports experts modules as one opaque op (execute/expert_dispatch.py)."""

from __future__ import annotations

import contextlib
from typing import Callable, Iterator

import torch.nn as nn


@contextlib.contextmanager
def replaced_forwards(model: nn.Module, make: dict[str, Callable[[nn.Module], Callable]]) -> Iterator[None]:
    """While inside, submodule ``fqn`` of ``model`` runs ``make[fqn](module)`` as its forward; an
    instance-level forward it had before comes back after, else the class's."""
    patched = []
    for fqn, forward_of in make.items():
        module = model.get_submodule(fqn)
        patched.append((module, module.__dict__.get("forward")))
        module.forward = forward_of(module)
    try:
        yield
    finally:
        for module, own in patched:
            del module.forward
            if own is not None:
                module.forward = own
