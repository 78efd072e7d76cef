"""Trainable parameters that no gradient reaches, found before DDP wraps the model.

DDP without ``find_unused_parameters`` waits for every trainable parameter's gradient; a parameter the forward
never reads (Hugging Face Dinov2's ``mask_token`` without a mask, BART's ``shared`` embedding when the word
embeddings are untied), reads only under ``torch.no_grad()``, or reads into an output the loss ignores (a pooler:
BigBird, SqueezeBERT, FNet, CANINE, ESM's contact head) never gets one, and the planner's best plan, DDP, stopped
at its first step. :func:`unreached_params` runs the forward and the loss once on the micro-batch, as the first step
will, and walks the autograd graph from the loss to the parameters it reaches; nothing of it stays (the generator
states are forked, the buffers put back, the graph freed: no backward runs). DDP then looks for unused parameters
each step (``find_unused_parameters``: an all-reduce of their map) and leaves their gradients unset, as one device
does. A forward or loss that fails here is not judged: DDP runs as before, and the trainer names a parameter without
gradient after the first backward in one sentence. The meta device would spare the compute but not the ~1 s every
rank took to import what its kernels load (sympy), and a forward that assigns to its module would leave meta tensors
in the model.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable

import torch
import torch.nn as nn
import torch.utils._pytree as pytree


def unreached_params(
    model: nn.Module,
    inputs: tuple | None,
    *,
    loss_fn: Callable | None = None,
    target: Any = None,
    context: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext,
) -> list[str]:
    """Names of ``model``'s trainable parameters that a forward on ``inputs`` (under ``context``, the step's
    autocast) gives no path to its loss (with ``loss_fn`` and ``target``) or, without them or where the loss cannot
    run, to its outputs (module docstring); empty when there is none, no input, or the forward fails."""
    trainable = {name: p for name, p in model.named_parameters() if p.requires_grad}
    if not trainable or inputs is None:
        return []
    kept = {name: b.detach().clone() for name, b in model.named_buffers()}
    devices = sorted({p.device.index for p in trainable.values() if p.device.type == "cuda"})
    try:
        with torch.random.fork_rng(devices=devices), context():
            reached = _reached(_loss(loss_fn, model(*inputs), target))
    except Exception:  # noqa: BLE001 - a forward that fails here is not judged (module docstring)
        return []
    finally:
        with torch.no_grad():
            for name, buffer in model.named_buffers():
                if name in kept:
                    buffer.copy_(kept[name])
    return [name for name, param in trainable.items() if id(param) not in reached]


def _loss(loss_fn: Callable | None, outputs: Any, target: Any) -> Any:
    """``loss_fn(outputs, target)``, or ``outputs`` where there is no loss function or it fails here."""
    if loss_fn is None:
        return outputs
    try:
        return loss_fn(outputs, target)
    except Exception:  # noqa: BLE001 - judged from the outputs then
        return outputs


def _reached(outputs: Any) -> set[int]:
    """ids of the leaf tensors the autograd graph of ``outputs`` accumulates gradients into."""
    tensors = [t for t in pytree.tree_leaves(outputs) if isinstance(t, torch.Tensor) and t.requires_grad]
    found = {id(t) for t in tensors if t.grad_fn is None}  # a parameter returned as it is
    stack, seen = [t.grad_fn for t in tensors if t.grad_fn is not None], set()
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        variable = getattr(node, "variable", None)  # AccumulateGrad: the leaf it accumulates into
        if variable is not None:
            found.add(id(variable))
        stack.extend(next_node for next_node, _ in node.next_functions)
    return found
