"""Split backward: a node's backward as input gradients (B) and weight gradients (W), the two parts a
zero-bubble schedule runs apart (Qi et al. ICLR'24, "Zero Bubble Pipeline Parallelism", section 2;
docs/cost-model.md, "Zero-bubble schedules").

A node that multiplies by a weight (a linear, a convolution, an expert's grouped GEMM) computes
dL/dW = X^T dY, one GEMM the size of its forward's (Narayanan et al. SC'21 eq. 3 counts the backward
as 2x the forward: dgrad + wgrad). So per node, with the traced FLOPs (``fwd_flops``, ``bwd_flops``):

    W_flops = min(fwd_flops, bwd_flops)   when the node holds a trainable parameter (Graph.trains)
            = 0                           otherwise (frozen weights: no W; norms, element-wise, attention,
                                           embedding lookups: their weight gradients are no matmul)
    B_flops = bwd_flops - W_flops         (a first layer fed raw data has no B: bwd_flops = W_flops)
    w_s     = bwd_s * W_flops / bwd_flops the node's priced backward seconds split by FLOPs

Between a micro-batch's B and its W, torch's stage_backward_input keeps the gradient arriving at each
node where a trained parameter's path meets the stage input's (its ``param_groups`` "grads": dL/dY, the
node's output size in the run's dtype), which stage_backward_weight starts from: ``held_bytes`` =
output_bytes * dtype scale per node holding a trained parameter, norms included (their W is no matmul,
but torch keeps their intermediate all the same: a GPT block's two LayerNorm outputs in fp32 beside its
four linears' in bf16, measured on examples/gpt.py); a node no input gradient reaches keeps none: an
embedding lookup (its input is indices), a view or cast of a weight (the node that meets the input keeps it).
"""

from __future__ import annotations

from autoplan.cost.compute.dtypes import RunDtypes
from autoplan.cost.compute.roofline import activation_scale
from autoplan.types.graph import Graph, OpNode


def weight_grad_flops(graph: Graph, node: OpNode) -> float:
    """W_flops of ``node`` (module docstring)."""
    if node.param_count <= 0 or not graph.trains(node) or node.bwd_flops <= 0:
        return 0.0
    return float(min(node.fwd_flops, node.bwd_flops))


def weight_grad_s(graph: Graph, node: OpNode, *, bwd_s: float, wgrad_flops: float | None = None) -> float:
    """The W share of the node's backward seconds ``bwd_s`` (module docstring); ``wgrad_flops``: its
    :func:`weight_grad_flops` when the caller has it already."""
    wgrad = weight_grad_flops(graph, node) if wgrad_flops is None else wgrad_flops
    return bwd_s * wgrad / node.bwd_flops if wgrad else 0.0


def weight_grad_held_bytes(graph: Graph, node: OpNode, *, precision: str, dtypes: RunDtypes | None = None) -> float:
    """The output gradient ``node`` keeps from its B until its W, for the whole batch in its output's run
    dtype (module docstring; ``dtypes``: cost/compute/dtypes.py, else every float in ``precision``); 0 for a
    node without a trained parameter, or one no input gradient reaches."""
    if node.param_count <= 0 or not graph.trains(node) or not _meets_a_gradient(graph, node):
        return 0.0
    return node.output_bytes * activation_scale(node, precision=precision, dtypes=dtypes)


def _meets_a_gradient(graph: Graph, node: OpNode) -> bool:
    """Whether a value carrying a gradient from the inputs flows into ``node`` (module docstring; not an
    embedding lookup, whose input is indices, nor a node made from parameters alone)."""
    preds, _ = graph.adjacency()
    carriers = graph.input_grad_nodes()
    return any(p in carriers for p in preds[node.name])
