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
    docstring); [] too when the model does not run at twice the batch on the meta device."""
    batch, shapes = graph.batch_size, _output_shapes(graph)
    if batch < 2 or not any(sum(d == batch for d in shape) >= 2 for shape in shapes):
        return []
    try:
        with torch.device("meta"), torch.no_grad():
            grown = [t for t in tree_leaves(model(*model_file.inputs(2 * batch))) if isinstance(t, torch.Tensor)]
    except Exception:  # a file or model with its own limits on the batch: nothing to compare with
        return []
    if len(grown) != len(shapes):
        return []
    for shape, tensor in zip(shapes, grown):  # the same output at both batches: its dims that doubled
        doubled = [
            d for d, size in enumerate(shape) if size == batch and d < tensor.dim() and tensor.shape[d] == 2 * batch
        ]
        if len(doubled) >= 2:
            return shape
    return []


def _output_shapes(graph: Graph) -> list[list[int]]:
    output = next((n for n in graph.nodes if n.op == "output"), None)
    return [] if output is None else output.attrs.get("output_shapes") or [output.output_shape]
