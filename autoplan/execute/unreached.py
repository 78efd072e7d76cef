"""Trainable parameters that no gradient reaches, found before DDP wraps the model.

DDP without ``find_unused_parameters`` waits for every trainable parameter's gradient; a parameter the forward
never reads (Hugging Face Dinov2's ``mask_token`` without a mask, BART's ``shared`` embedding when the word
embeddings are untied) or reads only under ``torch.no_grad()`` never gets one, and the planner's best plan, DDP,
stopped at its first step. :func:`unreached_params` runs the forward once on fake tensors (no compute, no memory,
the real parameters and buffers untouched) and walks its autograd graph from the outputs to the parameters it
reaches; DDP then looks for unused parameters each step (``find_unused_parameters``: an all-reduce of their map,
which the cost model's audit predicts for such a graph: cost/dp/messages.py ``unused_map``), and leaves their
gradients unset, as one device does. A forward that cannot run on fake tensors is not judged: DDP runs as before,
and the trainer names a parameter without gradient after the first backward in one sentence.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
import torch.nn as nn
import torch.utils._pytree as pytree
from torch._subclasses.fake_tensor import FakeTensorMode


def unreached_params(
    model: nn.Module, inputs: tuple | None, *, loss_fn: Callable | None = None, target: Any = None
) -> list[str]:
    """Names of ``model``'s trainable parameters that a forward on ``inputs`` gives no path to its loss (with
    ``loss_fn`` and ``target``) or, without them or where the loss cannot run, to its outputs (module docstring);
    empty when there is none, no input, or the forward cannot run on fake tensors. From the loss: a pooler whose
    output the loss never reads (Hugging Face BigBird, SqueezeBERT, FNet, CANINE, ESM's contact head) gets no
    gradient either."""
    trainable = {name: p for name, p in model.named_parameters() if p.requires_grad}
    if not trainable or inputs is None:
        return []
    try:
        with FakeTensorMode(allow_non_fake_inputs=True) as mode:
            fake = {name: mode.from_tensor(t) for name, t in (*model.named_parameters(), *model.named_buffers())}
            args = pytree.tree_map_only(torch.Tensor, mode.from_tensor, tuple(inputs))
            outputs = torch.func.functional_call(model, fake, args)
            outputs = _loss(loss_fn, outputs, pytree.tree_map_only(torch.Tensor, mode.from_tensor, target))
    except Exception:  # noqa: BLE001 - any forward fake tensors cannot run: not judged (module docstring)
        return []
    reached = _reached(outputs)
    return [name for name in trainable if id(fake[name]) not in reached]


def _loss(loss_fn: Callable | None, outputs: Any, target: Any) -> Any:
    """``loss_fn(outputs, target)``, or ``outputs`` where there is no loss function or it cannot run here."""
    if loss_fn is None:
        return outputs
    try:
        return loss_fn(outputs, target)
    except Exception:  # noqa: BLE001 - a loss that fake tensors cannot run (CTC): judged from the outputs
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
