"""Swap a module's parameters and buffers for storage-free stand-ins, and put them back.

Tracing never touches real weights. :func:`swapped` replaces every parameter and buffer of a
module tree by a stand-in made by ``make(tensor)`` (an empty meta tensor, or a FakeTensor on
the CPU), and restores the originals on exit. Tensors shared between modules (tied
embeddings) stay shared: each distinct tensor is converted once, by identity.
"""

from __future__ import annotations

import contextlib
from typing import Callable, Iterator

import torch


def _slots(model: torch.nn.Module) -> list[tuple[torch.nn.Module, str, str, torch.Tensor]]:
    """(owner module, attribute name, kind, tensor) for every parameter and buffer, ties included."""
    slots = []
    for module in model.modules():
        for name, param in module._parameters.items():
            if param is not None:
                slots.append((module, name, "param", param))
        for name, buf in module._buffers.items():
            if buf is not None:
                slots.append((module, name, "buffer", buf))
    return slots


@contextlib.contextmanager
def swapped(
    model: torch.nn.Module,
    make: Callable[[torch.Tensor], torch.Tensor],
    *,
    make_param: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> Iterator[torch.nn.Module]:
    """Within the block, ``model`` holds ``make(t)`` in place of each buffer ``t``, and ``make_param(t)``
    (default: ``nn.Parameter(make(t))`` with ``t``'s ``requires_grad``) in place of each parameter."""
    slots = _slots(model)
    memo: dict[int, torch.Tensor] = {}
    for module, name, kind, tensor in slots:
        if id(tensor) not in memo:
            if kind != "param":
                memo[id(tensor)] = make(tensor)
            elif make_param is not None:
                memo[id(tensor)] = make_param(tensor)
            else:
                memo[id(tensor)] = torch.nn.Parameter(make(tensor), requires_grad=tensor.requires_grad)
        (module._parameters if kind == "param" else module._buffers)[name] = memo[id(tensor)]
    try:
        yield model
    finally:
        for module, name, kind, tensor in slots:
            (module._parameters if kind == "param" else module._buffers)[name] = tensor


def empty_like_on(tensor: torch.Tensor, device: str) -> torch.Tensor:
    """An uninitialised tensor of the same shape and dtype on ``device`` (meta, or cpu under FakeTensorMode)."""
    return torch.empty(tuple(tensor.shape), dtype=tensor.dtype, device=device)


def to_meta(tensor: torch.Tensor) -> torch.Tensor:
    return empty_like_on(tensor, "meta")


@contextlib.contextmanager
def training_mode(model: torch.nn.Module) -> Iterator[None]:
    """Put every module in train mode (tracing describes a training step), then restore each one."""
    modes = [(module, module.training) for module in model.modules()]
    model.train()
    try:
        yield
    finally:
        for module, mode in modes:
            module.training = mode


def map_tensors(value, fn: Callable[[torch.Tensor], torch.Tensor]):
    """Apply ``fn`` to every tensor inside a (nested) tuple/list/dict, keeping everything else."""
    from torch.utils._pytree import tree_map

    return tree_map(lambda x: fn(x) if isinstance(x, torch.Tensor) else x, value)


def nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")
