"""What a pipeline stage sends and returns (docs/executor.md, "Pipeline parallelism").

- Every tensor a stage sends is contiguous, and so is every gradient it sends back for a tensor it received
  (:func:`send_contiguous`, :func:`send_contiguous_grads`): torch's ``PipelineStage`` receives into buffers with
  the sender's strides, and gloo and NCCL send and receive only contiguous tensors.
- Under a split backward a stage returns its own copy of each output that is a view, or that the stage also reads
  (:func:`read_inside`, :func:`owned_outputs`): torch detaches the outputs in place after B.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.fx as fx
import torch.nn as nn

#: GraphModule.meta key: the stage's outputs it also reads (:func:`read_inside`)
READ_INSIDE = "autoplan.read_inside"


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


def owned_outputs(module: nn.Module, args: Any, output: Any, *, read_inside: frozenset = frozenset()) -> Any:
    """A stage's outputs that are views (of an input it carries through, of a reshape), or that the stage also
    reads (``read_inside``, under recomputation: T5's encoder states, which its decoder blocks read and the model
    returns), cloned into their own storage. torch detaches stage outputs in place after B to free their graph
    (``stage_backward_input``; the last stage's in ``backward_one_chunk``): in-place detach refuses a view (T5's
    carried encoder states), and a block recomputed in W re-ran on the detached tensor, saving fewer tensors than
    its forward (CheckpointError). One boundary tensor's copy per such output, under the schedules that split B
    from W (tests/odd_models/shared_bias.py)."""
    if isinstance(output, torch.Tensor):
        return output.clone() if output._is_view() or 0 in read_inside else output
    if isinstance(output, tuple):
        own = [isinstance(o, torch.Tensor) and (o._is_view() or i in read_inside) for i, o in enumerate(output)]
        return tuple(o.clone() if apart else o for o, apart in zip(output, own))
    return output


def read_inside(module: fx.GraphModule) -> frozenset:
    """The positions of the stage's outputs whose tensor the stage also reads (any user but the output and the
    ``contiguous`` :func:`send_contiguous` puts before it): a value the next stage needs too."""
    output = module.graph.output_node()
    values = output.args[0]
    flat = list(values) if isinstance(values, (tuple, list)) else [values]
    read = set()
    for index, value in enumerate(flat):
        if not isinstance(value, fx.Node):
            continue
        source = value.args[0] if value.op == "call_method" and value.target == "contiguous" else value
        if any(user is not output and user is not value for user in source.users):
            read.add(index)
    return frozenset(read)
