"""Per-node facts that need the node's argument values: op kind, parameters used, attrs.

Parameters are named canonically: a tensor tied into several modules (a GPT's token
embedding and its output head) is named by its first fully qualified name, the name
``Graph.parameters`` uses, so the cost model can count each parameter once.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.fx
from torch.utils._pytree import tree_leaves

from autoplan.trace import classify
from autoplan.trace.flops import attention_recompute_flops


def node_params(
    node: torch.fx.Node, gm: torch.fx.GraphModule, module: torch.nn.Module | None, canonical: dict[str, str]
) -> list[tuple[str, torch.Tensor]]:
    """(canonical name, tensor) for each parameter the node reads: its module's, or its get_attr args'.
    A node none of whose inputs is a get_attr reads none: fx lists every node its arguments hold in
    ``all_input_nodes`` (``torch.fx.node.map_arg``: tuples, lists, dicts and slices, the containers an
    fx argument holds), so the walk over its arguments is skipped (about 90% of a transformer's nodes)."""
    if module is not None:
        found = [(f"{node.target}.{name}", p) for name, p in module.named_parameters()]
    elif not any(arg.op == "get_attr" for arg in node.all_input_nodes):
        return []
    else:
        found = []
        for arg in tree_leaves((node.args, node.kwargs)):
            if isinstance(arg, torch.fx.Node) and arg.op == "get_attr":
                value = _get_attr(gm, arg.target)
                if isinstance(value, torch.nn.Parameter):
                    found.append((arg.target, value))
    seen, unique = set(), []
    for name, tensor in found:
        name = canonical.get(name, name)
        if name not in seen:
            seen.add(name)
            unique.append((name, tensor))
    return unique


def _get_attr(gm: torch.fx.GraphModule, target: str) -> Any:
    value: Any = gm
    for part in target.split("."):
        value = getattr(value, part)
    return value


def _arg(args: tuple, kwargs: dict, index: int, name: str, default: Any = None) -> Any:
    if name in kwargs:
        return kwargs[name]
    return args[index] if len(args) > index else default


def kind_and_attrs(
    node: torch.fx.Node,
    module: torch.nn.Module | None,
    args: tuple,
    kwargs: dict,
    output: Any,
    params: list[tuple[str, torch.Tensor]],
) -> tuple[str, dict[str, Any]]:
    """The node's op kind and its attrs (see docs/trace.md for each key)."""
    if node.op == "placeholder":
        return "input", {}
    if module is not None:
        kind = classify.module_kind(module)
        return kind, _module_attrs(kind, module, args, kwargs)
    name = classify.short_name(node)
    weights = {id(t) for _, t in params if t.dim() >= 2}
    kind = classify.function_kind(name, has_weight_param=bool(weights), output=output)
    return kind, _function_attrs(kind, name, args, kwargs, weights)


def _module_attrs(kind: str, module: torch.nn.Module, args: tuple, kwargs: dict) -> dict[str, Any]:
    type_name = type(module).__name__
    if kind == "linear":  # tp_splittable: the executor splits nn.Linear modules only (a router need not be one)
        attrs = classify.linear_attrs(
            weight=module.weight, bias=getattr(module, "bias", None) is not None, weight_is_out_in=True,
            module_type=type_name,
        )  # fmt: skip
        return {**attrs, "tp_splittable": isinstance(module, torch.nn.Linear)}
    if kind == "embedding":
        return {
            **classify.embedding_attrs(module.weight, type_name, sparse=bool(getattr(module, "sparse", False))),
            "tp_splittable": isinstance(module, torch.nn.Embedding),
        }
    if kind == "conv":
        transposed = isinstance(module, torch.nn.modules.conv._ConvTransposeNd)
        return classify.conv_attrs(module.weight, groups=module.groups, transposed=transposed, module_type=type_name)
    if kind == "attention" and isinstance(module, torch.nn.MultiheadAttention):
        return _mha_attrs(module, args)
    return {"module_type": type_name}


def _sparse_embedding_call(args: tuple, kwargs: dict, weight: torch.Tensor) -> bool:
    """``sparse`` of an embedding call: F.embedding(input, weight, padding_idx, max_norm, norm_type,
    scale_grad_by_freq, sparse) or aten.embedding(weight, indices, padding_idx, scale_grad_by_freq, sparse)."""
    index = 4 if args and args[0] is weight else 6
    return bool(_arg(args, kwargs, index, "sparse", False))


def _mha_attrs(module: torch.nn.MultiheadAttention, args: tuple) -> dict[str, Any]:
    query, key = args[0], args[1]
    seq_dim = 1 if module.batch_first else 0
    return {
        "num_heads": module.num_heads,
        "num_kv_heads": module.num_heads,
        "head_dim": module.head_dim,
        "q_len": int(query.shape[seq_dim]),
        "kv_len": int(key.shape[seq_dim]),
        "causal": False,
        "module_type": "MultiheadAttention",
    }


def _function_attrs(kind: str, name: str, args: tuple, kwargs: dict, weights: set[int]) -> dict[str, Any]:
    if kind == "linear":
        return _linear_call_attrs(name, args, kwargs, weights)
    if kind == "embedding":
        weight = (
            next(a for a in args if isinstance(a, torch.Tensor) and id(a) in weights)
            if weights
            else _arg(args, kwargs, 1, "weight")
        )
        return classify.embedding_attrs(weight, name, sparse=_sparse_embedding_call(args, kwargs, weight))
    if kind == "conv":
        if name in (
            "convolution",
            "_convolution",
        ):  # aten: (input, weight, bias, stride, padding, dilation, transposed, output_padding, groups)
            transposed, groups = bool(_arg(args, kwargs, 6, "transposed", False)), _arg(args, kwargs, 8, "groups", 1)
        else:  # F.conv2d / F.conv_transpose2d: groups is the 7th argument
            transposed, groups = "transpose" in name, _arg(args, kwargs, 6, "groups", 1)
        return classify.conv_attrs(args[1], groups=int(groups), transposed=transposed, module_type=name)
    if kind == "attention":
        query, key = args[0], args[1]
        attrs = classify.attention_attrs(
            query,
            key,
            causal=bool(_arg(args, kwargs, 5, "is_causal", False)),
            has_mask=_arg(args, kwargs, 3, "attn_mask") is not None,
            dropout_p=float(_arg(args, kwargs, 4, "dropout_p", 0.0)),
        )
        attrs["bwd_recompute_flops"] = attention_recompute_flops(tuple(query.shape), tuple(key.shape))
        return attrs
    if classify.is_split(name):
        return _split_attrs(name, args, kwargs)
    return {}


def _split_attrs(name: str, args: tuple, kwargs: dict) -> dict[str, Any]:
    """The split's input shape and dim, so dataflow can tell a fused-feature split from a sequence split."""
    dim = _arg(args, kwargs, 1, "dim", 0) if name == "unbind" else _arg(args, kwargs, 2, "dim", 0)
    shape = list(args[0].shape)
    return {"split_dim": int(dim) % max(len(shape), 1), "input_shape": [int(s) for s in shape]}


def _linear_call_attrs(name: str, args: tuple, kwargs: dict, weights: set[int]) -> dict[str, Any]:
    if name == "linear":
        bias = _arg(args, kwargs, 2, "bias")
        return classify.linear_attrs(weight=args[1], bias=bias is not None, weight_is_out_in=True, module_type=name)
    if name == "einsum":
        return _einsum_attrs(args, weights)
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    weight = next(t for t in tensors if id(t) in weights)
    has_bias = name in ("addmm", "baddbmm")
    operands = tensors[1:] if has_bias else tensors
    weight_first = operands and operands[0] is weight
    return classify.linear_attrs(weight=weight, bias=has_bias, weight_is_out_in=bool(weight_first), module_type=name)


def _einsum_attrs(args: tuple, weights: set[int]) -> dict[str, Any]:
    """A weight contracted by ``einsum(equation, *operands)`` (or aten's ``einsum(equation, [operands])``, as
    torch.export records it; HF XLNet's ``einsum("ibh,hnd->ibnd", h, self.q)``): in_features the product of the
    weight's dims contracted with another operand's, out_features that of its dims kept in the output. Not split
    by tensor parallelism: the executor splits 2-D weights of linears and matmuls only."""
    equation = str(args[0]).replace(" ", "")
    operands = [t for t in tree_leaves(list(args[1:])) if isinstance(t, torch.Tensor)]
    weight = next(t for t in operands if id(t) in weights)
    attrs = {"bias": False, "weight_layout": "in_out", "module_type": "einsum", "tp_splittable": False}
    specs, _, output = equation.partition("->")
    inputs = specs.split(",")
    if "." in equation or len(inputs) != len(operands) or not output:  # ellipses, implicit output: the weight's dims
        in_features, out_features = weight.shape[-2:] if weight.ndim >= 2 else (weight.numel(), 1)
        return {**attrs, "in_features": int(in_features), "out_features": int(out_features)}
    index = next(i for i, t in enumerate(operands) if t is weight)
    others = {c for i, spec in enumerate(inputs) if i != index for c in spec}
    size = dict(zip(inputs[index], weight.shape))
    contracted = [int(size[c]) for c in inputs[index] if c in others and c not in output]
    kept = [int(size[c]) for c in inputs[index] if c in output and c not in others]
    return {**attrs, "in_features": math.prod(contracted), "out_features": math.prod(kept)}
