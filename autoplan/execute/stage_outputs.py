"""What a pipeline stage sends and returns (docs/executor.md, "Pipeline parallelism").

- Every tensor a stage sends is contiguous, and so is every gradient it sends back for a tensor it received
  (:func:`send_contiguous`, :func:`send_contiguous_grads`): torch's ``PipelineStage`` receives into buffers with
  the sender's strides, and gloo and NCCL send and receive only contiguous tensors.
- Under a split backward a stage returns its own copy of each output that needs a gradient or is a view
  (:func:`owned_outputs`): torch detaches the outputs in place after B.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.fx as fx
import torch.nn as nn


def send_contiguous(module: fx.GraphModule) -> None:
    """Make every tensor a stage sends contiguous. ``PipelineStage`` receives into buffers with
    the strides of the sender's output and gloo and NCCL send only contiguous tensors, so a
    stage ending in a view (an LSTM's ``batch_first`` output is a transpose) would fail at its
    first send; ``contiguous()`` is free where the tensor already is."""
    output = module.graph.output_node()
    values = output.args[0]
    flat = list(values) if isinstance(values, (tuple, list)) else [values]
    with module.graph.inserting_before(output):
        made = [module.graph.call_method("contiguous", (v,)) if isinstance(v, fx.Node) else v for v in flat]
    output.args = (type(values)(made) if isinstance(values, (tuple, list)) else made[0],)
    module.recompile()


def send_contiguous_grads(module: fx.GraphModule) -> None:
    """Make the gradient a stage sends back for each tensor it received contiguous. ``PipelineStage`` receives
    gradients into buffers with the strides the sender's backward gave them, and gloo receives only into
    contiguous ones: a received tensor that a ``torch.cat`` reads (a U-Net's skip connection) gets a slice of
    the cat's gradient, and the sending stage's receive failed ("input tensor has to be contiguous")."""
    placeholders = [n for n in module.graph.nodes if n.op == "placeholder"]
    if not placeholders:
        return
    with module.graph.inserting_after(placeholders[-1]):
        for node in placeholders:
            users = list(node.users)
            hooked = module.graph.call_function(contiguous_grad, (node,))
            for user in users:
                user.replace_input_with(node, hooked)
    module.recompile()


def contiguous_grad(value: Any) -> Any:
    """``value``, whose gradient, when autograd computes one, is made contiguous first (a hook on the tensor)."""
    if isinstance(value, torch.Tensor) and value.requires_grad:
        value.register_hook(_contiguous)
    return value


def _contiguous(grad: torch.Tensor) -> torch.Tensor:
    return grad.contiguous()


def owned_outputs(module: nn.Module, args: Any, output: Any) -> Any:
    """A stage's tensor outputs that need a gradient or are views, each cloned into its own storage (one boundary
    copy per output and micro-batch, under the schedules that split B from W). torch detaches stage outputs in place
    after B to free their graph (``stage_backward_input``; the last stage's in ``backward_one_chunk``): in-place detach
    refuses a view (T5's carried encoder states), and an output the stage also reads was detached under the ops that
    saved it, so W found its saved tensor detached (BART's encoder states, made by the stage's last encoder block and
    read by its decoder blocks, returned through another node than the one they read) or re-ran a recomputed block on
    it, saving fewer tensors than its forward (CheckpointError: tests/odd_models/shared_bias.py). Which outputs a stage
    reads cannot be told from its graph alone (two getitems of one tuple are one tensor), so every one is copied."""
    if isinstance(output, torch.Tensor):
        return output.clone() if _own(output) else output
    if isinstance(output, tuple):
        return tuple(o.clone() if _own(o) else o for o in output)
    return output


def _own(value: Any) -> bool:
    """A tensor torch's in-place detach would reach through: one that needs a gradient, or a view."""
    return isinstance(value, torch.Tensor) and (value.requires_grad or value._is_view())
