"""What a pipeline's stages take and give back (docs/executor.md, "Pipeline parallelism"): forward()'s arguments
that are not tensors, fixed at their traced values for the split (a stage receives tensors only), and the model's
output rebuilt from the last stage's tensors with the constants (a None in a tuple) put back."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Iterator

import torch
import torch.nn as nn
import torch.utils._pytree as pytree


def is_bound_value(value: Any) -> bool:
    """A forward() argument the split fixes at its traced value: a None, a Python scalar or string."""
    return value is None or isinstance(value, (bool, int, float, str))


def stage_inputs(args: tuple) -> tuple:
    """The tensors a first pipeline stage receives for forward()'s ``args``: every tensor among them, inside
    tuples, lists and dicts too (a dict of ids and mask), in pytree order; the other values are fixed by the split
    (:func:`values_bound`)."""
    return tuple(leaf for leaf in pytree.tree_leaves(tuple(args)) if isinstance(leaf, torch.Tensor))


@contextlib.contextmanager
def values_bound(model: nn.Module, args: tuple) -> Iterator[tuple]:
    """Export ``model`` taking :func:`stage_inputs` of ``args``: its forward() rebuilds ``args`` from those tensors,
    with every other value (a Python float such as a temperature, a None) fixed at its value in ``args``. A stage
    receives tensors only (torch's schedule refuses a float, a None or a dict: "Stage args must be tensors"), and
    the export kept a float as an input every stage up to its use had to carry. The trainer passes the same tensors
    (execute/trainer.py)."""
    leaves, spec = pytree.tree_flatten(tuple(args))
    if all(isinstance(a, torch.Tensor) for a in args):
        yield args
        return
    fixed = {i: leaf for i, leaf in enumerate(leaves) if not isinstance(leaf, torch.Tensor)}
    forward, own = model.forward, model.__dict__.get("forward")

    def bound(*tensors: Any, **kwargs: Any) -> Any:
        given = iter(tensors)
        rebuilt = pytree.tree_unflatten([fixed[i] if i in fixed else next(given) for i in range(len(leaves))], spec)
        return forward(*rebuilt, **kwargs)

    model.forward = bound
    try:
        yield stage_inputs(args)
    finally:
        if own is None:
            del model.forward
        else:
            model.forward = own


@dataclass(frozen=True)
class ModelOutput:
    """What the model returns, rebuilt from the last stage's tensors: its pytree spec, and the constants (a None
    in a tuple, as Hugging Face models return; the split writes them as values, not as tensors a stage could
    send) by their place among its leaves."""

    spec: pytree.TreeSpec
    constants: tuple[tuple[int, Any], ...] = ()

    def rebuild(self, tensors: list) -> Any:
        leaves, given = [], iter(tensors)
        fixed = dict(self.constants)
        for i in range(self.spec.num_leaves):
            leaves.append(fixed[i] if i in fixed else next(given))
        return pytree.tree_unflatten(leaves, self.spec)
