"""An output that couples the samples of a batch, which no split of the batch computes (docs/trace.md, "Capture").

autoplan splits a global batch over data-parallel ranks and micro-batches and averages their losses: the whole
batch's loss where the loss is a mean over samples. An in-batch contrastive loss (CLIP's: ``text @ image.T``, a
``[B, B]`` matrix scored against ``arange(B)``) scores each sample against every other sample of the batch, so on a
split each part scores against its own samples only: another loss, and other gradients, with nothing to notice
(--verify's reference splits alike). An output with two or more dims of the batch's size is run again on the meta
device at twice the batch; where two of them grow with it, its shape is recorded (``Graph.batch_coupled``) and the
planner keeps the batch whole (solve/space.py).
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._pytree import tree_leaves

from autoplan.types.graph import Graph


def coupled_output(model: torch.nn.Module, model_file: Any, graph: Graph) -> list[int]:
    """The shape of an output of ``model`` (on meta) that grows with the batch on two dims, or [] (module
    docstring); [] too when the model does not run at twice the batch on the meta device. The outputs at the batch
    and at twice it are both run and compared leaf by leaf: the graph's output node can hold fewer leaves than the
    model returns (HF SigLIP's ModelOutput: 4 against 8, its nested outputs and a tensor returned twice)."""
    batch, shapes = graph.batch_size, _output_shapes(graph)
    if batch < 2 or not any(sum(d == batch for d in shape) >= 2 for shape in shapes):
        return []
    try:
        at_batch, grown = (_leaves(model, model_file, size) for size in (batch, 2 * batch))
    except Exception:  # a file or model with its own limits on the batch: nothing to compare with
        return []
    if len(grown) != len(at_batch):
        return []
    for tensor, bigger in zip(at_batch, grown):  # the same output at both batches: its dims that doubled
        shape = [int(s) for s in tensor.shape]
        doubled = [d for d, size in enumerate(shape) if size == batch and bigger.dim() == tensor.dim()
                   and bigger.shape[d] == 2 * batch]  # fmt: skip
        if len(doubled) >= 2:
            return shape
    return []


def _leaves(model: torch.nn.Module, model_file: Any, batch: int) -> list[torch.Tensor]:
    """The tensors ``model`` returns for ``model_file``'s inputs at ``batch``, all on the meta device."""
    with torch.device("meta"), torch.no_grad():
        return [t for t in tree_leaves(model(*model_file.inputs(batch))) if isinstance(t, torch.Tensor)]


def _output_shapes(graph: Graph) -> list[list[int]]:
    output = next((n for n in graph.nodes if n.op == "output"), None)
    return [] if output is None else output.attrs.get("output_shapes") or [output.output_shape]
