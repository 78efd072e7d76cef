"""Map one fx node to an op kind (autoplan.types.graph.OP_KINDS) and the attrs the planner needs.

torch.fx graphs hold ``call_module`` nodes for torch.nn layers; torch.export graphs hold ATen
ops (``aten.linear.default``). Both are named by the same short name ("linear",
"embedding", "scaled_dot_product_attention", ...) and classified by the tables below.
A matmul whose weight operand is a parameter (``addmm(b, x, W)``, as Hugging Face's GPT-2
``Conv1D`` does) is a ``linear`` too, with its features read from the weight's layout.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.fx

_VIEW = {
    "view",
    "reshape",
    "transpose",
    "permute",
    "t",
    "flatten",
    "unflatten",
    "squeeze",
    "unsqueeze",
    "expand",
    "expand_as",
    "view_as",
    "contiguous",
    "split",
    "chunk",
    "unbind",
    "split_with_sizes",
    "tensor_split",
    "getitem",
    "narrow",
    "select",
    "slice",
    "size",
    "getattr",
    "_unsafe_view",
    "alias",
    "detach",
    "movedim",
    "swapaxes",
    "as_strided",
    "clone",
    "to",
    "type_as",
    "float",
    "half",
    "bfloat16",
    "_to_copy",
    "dim",
    "numel",
    "lift_fresh_copy",
}
_SPLITS = {"split", "chunk", "unbind", "split_with_sizes", "tensor_split"}
_NORM = {
    "layer_norm",
    "rms_norm",
    "batch_norm",
    "group_norm",
    "instance_norm",
    "native_layer_norm",
    "normalize",
    "_native_batch_norm_legit",
    "_native_batch_norm_legit_functional",
    "native_batch_norm",
    "_fused_rms_norm",
}
_REDUCTION = {
    "sum",
    "mean",
    "amax",
    "amin",
    "max",
    "min",
    "prod",
    "var",
    "std",
    "var_mean",
    "logsumexp",
    "norm",
    "avg_pool1d",
    "avg_pool2d",
    "avg_pool3d",
    "max_pool1d",
    "max_pool2d",
    "max_pool3d",
    "adaptive_avg_pool1d",
    "adaptive_avg_pool2d",
    "adaptive_avg_pool3d",
    "adaptive_max_pool2d",
    "max_pool2d_with_indices",
    "argmax",
    "argmin",
}
_LOSS = {
    "cross_entropy",
    "nll_loss",
    "mse_loss",
    "l1_loss",
    "smooth_l1_loss",
    "binary_cross_entropy",
    "binary_cross_entropy_with_logits",
    "kl_div",
    "huber_loss",
    "nll_loss_forward",
    "cross_entropy_loss",
}
_MATMUL = {"matmul", "mm", "bmm", "baddbmm", "addmm", "einsum", "__matmul__", "matmul_1"}
_CONV = {
    "conv1d",
    "conv2d",
    "conv3d",
    "convolution",
    "conv_transpose1d",
    "conv_transpose2d",
    "conv_transpose3d",
    "_convolution",
}
_ATTENTION = {
    "scaled_dot_product_attention",
    "_scaled_dot_product_flash_attention_for_cpu",
    "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_efficient_attention",
}
_CREATE = {
    "arange",
    "zeros",
    "ones",
    "full",
    "empty",
    "tensor",
    "ones_like",
    "zeros_like",
    "full_like",
    "empty_like",
    "triu",
    "tril",
    "randn",
    "rand",
    "randint",
    "scalar_tensor",
    "_assert_tensor_metadata",
    "sym_size",
}


def short_name(node: torch.fx.Node) -> str:
    """'linear' for aten.linear.default, F.linear and the Tensor method; 'module' for call_module."""
    if node.op == "call_module":
        return "module"
    if node.op == "call_method":
        return str(node.target)
    if isinstance(node.target, torch._ops.OpOverload):
        return node.target._schema.name.split("::")[-1]
    return getattr(node.target, "__name__", str(node.target))


def target_text(node: torch.fx.Node, module: torch.nn.Module | None) -> str:
    if module is not None:
        return type(module).__name__
    if isinstance(node.target, torch._ops.OpOverload):
        return str(node.target)
    return short_name(node)


def module_kind(module: torch.nn.Module) -> str:
    nn = torch.nn
    table = [
        ((nn.Linear,), "linear"),
        ((nn.Embedding, nn.EmbeddingBag), "embedding"),
        ((nn.modules.conv._ConvNd,), "conv"),
        ((nn.MultiheadAttention,), "attention"),
        ((nn.LayerNorm, nn.GroupNorm, nn.modules.batchnorm._NormBase, nn.RMSNorm), "norm"),
        ((nn.modules.loss._Loss,), "loss"),
        ((nn.Flatten, nn.Unflatten, nn.Identity), "view"),
        (
            (
                nn.modules.pooling._MaxPoolNd,
                nn.modules.pooling._AvgPoolNd,
                nn.AdaptiveAvgPool1d,
                nn.AdaptiveAvgPool2d,
                nn.AdaptiveAvgPool3d,
                nn.AdaptiveMaxPool2d,
            ),
            "reduction",
        ),
    ]
    for types, kind in table:
        if isinstance(module, types):
            return kind
    if type(module).__module__.startswith(("torch.nn.modules.activation", "torch.nn.modules.dropout")):
        return "elementwise"
    return "other"


def function_kind(name: str, *, has_weight_param: bool, output: Any) -> str:
    if name == "linear" or (name in _MATMUL and has_weight_param):
        return "linear"
    for names, kind in (
        (_ATTENTION, "attention"),
        ({"embedding"}, "embedding"),
        (_CONV, "conv"),
        (_MATMUL, "matmul"),
        (_NORM, "norm"),
        (_LOSS, "loss"),
        (_REDUCTION, "reduction"),
        (_VIEW, "view"),
    ):
        if name in names:
            return kind
    if name in _CREATE or not isinstance(output, torch.Tensor) or not output.is_floating_point():
        return "other"
    return "elementwise"


def is_split(name: str) -> bool:
    return name in _SPLITS


# ---- attrs ---------------------------------------------------------------------------------
def linear_attrs(*, weight: torch.Tensor, bias: bool, weight_is_out_in: bool, module_type: str) -> dict[str, Any]:
    """in/out features from the weight: [out, in] for nn.Linear / F.linear, [in, out] for x @ W."""
    out_features, in_features = weight.shape[-2:] if weight_is_out_in else weight.shape[-2:][::-1]
    return {
        "in_features": int(in_features),
        "out_features": int(out_features),
        "bias": bool(bias),
        "weight_layout": "out_in" if weight_is_out_in else "in_out",
        "module_type": module_type,
    }


def embedding_attrs(weight: torch.Tensor, module_type: str, *, sparse: bool = False) -> dict[str, Any]:
    """Table shape and caller; ``sparse`` (its gradient is a sparse tensor of the rows read) only when True."""
    attrs = {"num_embeddings": int(weight.shape[0]), "embedding_dim": int(weight.shape[1]), "module_type": module_type}
    return {**attrs, "sparse": True} if sparse else attrs


def conv_attrs(weight: torch.Tensor, *, groups: int, transposed: bool, module_type: str) -> dict[str, Any]:
    out_c, in_per_group = weight.shape[:2]
    in_channels = in_per_group * groups
    if transposed:  # weight is [in, out/groups, k...]
        in_channels, out_c = weight.shape[0], weight.shape[1] * groups
    return {
        "in_channels": int(in_channels),
        "out_channels": int(out_c),
        "kernel_size": [int(k) for k in weight.shape[2:]],
        "groups": int(groups),
        "module_type": module_type,
    }


def attention_attrs(
    query: torch.Tensor, key: torch.Tensor, *, causal: bool, has_mask: bool, dropout_p: float
) -> dict[str, Any]:
    """From the SDPA call's [b, heads, seq, head_dim] query and key."""
    return {
        "num_heads": int(query.shape[-3]),
        "num_kv_heads": int(key.shape[-3]),
        "head_dim": int(query.shape[-1]),
        "q_len": int(query.shape[-2]),
        "kv_len": int(key.shape[-2]),
        "causal": bool(causal),
        "has_mask": bool(has_mask),
        "dropout_p": float(dropout_p),
    }
