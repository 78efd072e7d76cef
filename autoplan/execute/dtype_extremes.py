"""A dtype's extreme value, as model code asked for it, in a pipeline stage's exported graph.

Model code fills masked scores with ``torch.finfo(x.dtype).min`` (Hugging Face DeBERTa-v2's ``XSoftmax``, many
attention masks). torch.export traced the model in fp32 and recorded the value, -3.4028e38, as a constant; under
bf16 or fp16 autocast the stage's ``x`` is bf16 or fp16 and ``masked_fill`` refused it ("value cannot be converted
to type c10::BFloat16 without overflow"), where eager code, asking ``finfo`` of the tensor it has, used bf16's.
:func:`read_extremes_by_dtype` makes each fill of +-finfo(float32).max (and of its tiny, the smallest normal) read
the value from the dtype of the tensor filled, at run time; a dtype that holds the fp32 value fills it unchanged.
"""

from __future__ import annotations

import math

import torch
import torch.fx

_FP32 = torch.finfo(torch.float32)
#: aten ops that fill a tensor with a scalar, and the position of that scalar
FILLS = {
    torch.ops.aten.masked_fill.Scalar: 2,
    torch.ops.aten.masked_fill_.Scalar: 2,
    torch.ops.aten.fill.Scalar: 1,
    torch.ops.aten.fill_.Scalar: 1,
    torch.ops.aten.where.ScalarOther: 2,
    torch.ops.aten.clamp.default: 1,
}


def as_dtype_extreme(value: float, dtype: torch.dtype) -> float:
    """``value`` if it is not one of fp32's extremes (or ``dtype`` is no floating type), else ``dtype``'s own."""
    if not dtype.is_floating_point or not isinstance(value, float) or math.isinf(value):
        return value
    info = torch.finfo(dtype)
    if abs(value) == _FP32.max:
        return math.copysign(info.max, value)
    if abs(value) == _FP32.tiny:
        return math.copysign(info.tiny, value)
    return value


def _extreme_fill(op, position: int):
    def fill(*args):
        tensor = args[0] if op is not torch.ops.aten.where.ScalarOther else args[1]
        value = as_dtype_extreme(args[position], tensor.dtype)
        return op(*args[:position], value, *args[position + 1 :])

    fill.__name__ = f"extreme_{op.__name__.replace('.', '_')}"
    return fill


_WRAPPED = {op: _extreme_fill(op, position) for op, position in FILLS.items()}


def read_extremes_by_dtype(module: torch.nn.Module) -> int:
    """Rewrite every fill of an fp32 extreme in ``module``'s graphs (module docstring); return how many."""
    changed = 0
    for sub in module.modules():
        graph = getattr(sub, "graph", None)
        if not isinstance(graph, torch.fx.Graph):
            continue
        found = [n for n in graph.nodes if n.op == "call_function" and n.target in FILLS and _is_extreme(n)]
        for node in found:
            node.target = _WRAPPED[node.target]
        compiled = sub if isinstance(sub, torch.fx.GraphModule) else getattr(sub, "graph_module", None)
        if found and compiled is not None:
            compiled.recompile()
        changed += len(found)
    return changed


def _is_extreme(node: torch.fx.Node) -> bool:
    position = FILLS[node.target]
    value = node.args[position] if len(node.args) > position else None
    return isinstance(value, float) and abs(value) in (_FP32.max, _FP32.tiny)
