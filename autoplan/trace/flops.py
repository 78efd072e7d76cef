"""FLOP counting: torch's FlopCounterMode, with attention counted as model FLOPs on every backend.

Conventions (the ones MFU uses, PaLM appendix B and Narayanan et al. SC'21 eq. 3):
- a matmul of [m, k] x [k, n] is 2·m·k·n FLOPs; elementwise ops, norms and softmax count 0.
- attention (SDPA) forward is the two matmuls Q·K^T and P·V: 4·b·h·s_q·s_k·d, with no
  discount for a causal mask (Megatron's count); the ``causal`` attr lets a cost model halve it.
- attention backward is the four gradient matmuls (dV = P^T dO, dP = dO V^T, dQ = dS K,
  dK = dS^T Q): exactly 2x the forward. A flash-style kernel also recomputes Q·K^T in the
  backward; that recomputation is reported apart, as the node's ``bwd_recompute_flops`` attr,
  not in ``bwd_flops`` (model FLOPs exclude rematerialisation).

torch's own table counts 0 for the CPU flash kernel (``_scaled_dot_product_flash_attention_for_cpu``)
and 2.5x for the backward of the CUDA kernels; :data:`CUSTOM_FLOPS` fixes both, and is passed
to ``FlopCounterMode(custom_mapping=...)`` so no global registry is changed.
"""

from __future__ import annotations

import math

import torch
from torch.utils.flop_counter import sdpa_flop_count

aten = torch.ops.aten


def _sdpa_forward(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
    return sdpa_flop_count(query_shape, key_shape, value_shape)


def _sdpa_backward(grad_out_shape, query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
    return 2 * sdpa_flop_count(query_shape, key_shape, value_shape)


def attention_recompute_flops(query_shape, key_shape) -> int:
    """Q·K^T once more: what a flash-style backward recomputes (2·b·h·s_q·s_k·d; any leading dims, as SDPA takes
    ``[..., s, d]``: a 3-D ``[b, s, d]`` query refused the model with an unpacking error)."""
    *lead, s_q, d = query_shape
    return 2 * math.prod(lead) * s_q * key_shape[-2] * d


_FORWARD_OPS = [
    aten._scaled_dot_product_flash_attention_for_cpu,
    aten._scaled_dot_product_flash_attention,
    aten._scaled_dot_product_efficient_attention,
    aten._scaled_dot_product_cudnn_attention,
]
_BACKWARD_OPS = [
    aten._scaled_dot_product_flash_attention_for_cpu_backward,
    aten._scaled_dot_product_flash_attention_backward,
    aten._scaled_dot_product_efficient_attention_backward,
    aten._scaled_dot_product_cudnn_attention_backward,
]

#: op -> formula over argument shapes, for FlopCounterMode(custom_mapping=...).
CUSTOM_FLOPS = {**{op: _sdpa_forward for op in _FORWARD_OPS}, **{op: _sdpa_backward for op in _BACKWARD_OPS}}


def flop_counter() -> torch.utils.flop_counter.FlopCounterMode:
    """torch's counter, whose totals the trace reads, without its module tracker (:class:`_GlobalOnly`)."""
    counter = torch.utils.flop_counter.FlopCounterMode(display=False, custom_mapping=CUSTOM_FLOPS)
    if hasattr(counter, "mod_tracker"):
        counter.mod_tracker = _GlobalOnly()
    return counter


class _GlobalOnly:
    """FlopCounterMode's module tracker reduced to the one parent its totals read ("Global"). torch's tracker
    hooks every module call, forward and backward, for a per-module table the trace never reads; its backward
    hooks on a parametrized weight's leaf (``torch.nn.utils.parametrizations.weight_norm``) raised inside
    ``torch.autograd.grad`` ("A leaf node was passed to _will_engine_execute_node"), refusing the model."""

    parents = ("Global",)

    def __enter__(self) -> "_GlobalOnly":
        return self

    def __exit__(self, *exc: object) -> None:
        return None
