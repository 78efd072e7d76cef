"""A model that returns a plain ``@dataclass``: torch.export flattens a model's output with pytree, which knows no such
class ("Found <class Out> in output, which is not a known type"), so the export fallback of the trace refused the
model and the pipeline split refused every pipeline plan the planner had offered for it (torch.fx never flattens).
While :func:`dataclass_outputs_known` is entered, each dataclass the model returns becomes a pytree node (its fields
its children) as the forward returns it, before the export flattens it; the loss still gets the dataclass."""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any, Iterator

import torch.nn as nn
import torch.utils._pytree as pytree


@contextlib.contextmanager
def dataclass_outputs_known(model: nn.Module) -> Iterator[None]:
    """While inside, ``model``'s outputs have their dataclasses registered with pytree (module docstring)."""
    handle = model.register_forward_hook(lambda module, args, output: register_dataclasses(output))
    try:
        yield
    finally:
        handle.remove()


def register_dataclasses(output: Any) -> None:
    """Register each dataclass in ``output`` that pytree does not know, nested ones too, as a pytree node."""
    while unknown := {type(leaf) for leaf in pytree.tree_leaves(output) if _unregistered_dataclass(leaf)}:
        for cls in unknown:
            pytree.register_dataclass(cls)


def _unregistered_dataclass(value: Any) -> bool:
    return dataclasses.is_dataclass(value) and not isinstance(value, type) and type(value) not in pytree.SUPPORTED_NODES
