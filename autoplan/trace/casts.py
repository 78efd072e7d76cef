"""What an explicit cast in the model converts to, recorded per node so the cost model can give each
activation its dtype in the run (autoplan/cost/compute/dtypes.py; docs/cost-model.md, "Activation dtypes").

A trace in fp32 cannot tell ``x.to(torch.float32)`` (fp32 in every run) from ``x.to(input_dtype)`` (the
dtype ``input_dtype`` has in the run) by the output: both are fp32. The call's arguments can:

    cast_dtype   a constant target: ``.float()``, ``.half()``, ``.bfloat16()``, ``.to(torch.float32)``,
                 ``.type(torch.float16)``, any call with a ``dtype=`` keyword (``softmax(x, dtype=...)``)
    cast_like    a target read from a tensor: ``.to(y.dtype)``, ``.to(y)``, ``.type_as(y)``: the name of
                 the graph node (or parameter) ``y`` is
"""

from __future__ import annotations

from typing import Any

import torch
import torch.fx

from autoplan.trace.tensors import dtype_name

_FIXED = {"float": torch.float32, "double": torch.float64, "half": torch.float16, "bfloat16": torch.bfloat16}
_TO = ("to", "type", "_to_copy", "type_as")


def cast_attrs(node: torch.fx.Node, name: str, canonical: dict[str, str]) -> dict[str, Any]:
    """``{"cast_dtype": ...}`` or ``{"cast_like": ...}`` for an explicit cast (module docstring), else {}."""
    if name in _FIXED and node.op == "call_method":
        return {"cast_dtype": dtype_name(_FIXED[name])}
    if isinstance(node.kwargs.get("dtype"), torch.dtype):
        return {"cast_dtype": dtype_name(node.kwargs["dtype"])}
    if name not in _TO:
        return {}
    for arg in [*node.args[1:], node.kwargs.get("dtype"), node.kwargs.get("other")]:
        if isinstance(arg, torch.dtype):
            return {"cast_dtype": dtype_name(arg)}
        source = _dtype_source(arg, canonical)
        if source is not None:
            return {"cast_like": source}
    return {}


def _dtype_source(arg: Any, canonical: dict[str, str]) -> str | None:
    """The node (or parameter) whose dtype ``arg`` is: ``y.dtype`` (a getattr node), or ``y`` itself."""
    if not isinstance(arg, torch.fx.Node):
        return None
    if arg.op == "call_function" and arg.target is getattr and arg.args[1:] == ("dtype",):
        arg = arg.args[0]
        if not isinstance(arg, torch.fx.Node):
            return None
    if arg.op == "get_attr":
        return canonical.get(str(arg.target), str(arg.target))
    if arg.op == "call_function" and arg.target is getattr:  # y.dtype of a module attribute: self.weight.dtype
        return None
    return arg.name
