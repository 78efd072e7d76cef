"""Sharding rules DTensor lacks on CPU, registered once on import.

They live beside the trace because the planner asks the same registry the executor dispatches
through (autoplan/trace/dtensor_reach.py): an op is tensor-parallel runnable when DTensor, with
these rules added, has a strategy for it.

``F.scaled_dot_product_attention`` on CPU dispatches to
``aten._scaled_dot_product_flash_attention_for_cpu`` (and its backward), which DTensor has no
strategy for. Attention is independent per (batch, head), so it is legal to shard q, k, v,
the output and the log-sum-exp on the batch dim (0) or the head dim (1), or to replicate all;
the sequence dim is not (every query needs every key). CUDA kernels already have strategies.
"""

from __future__ import annotations

import torch
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.experimental import register_sharding

aten = torch.ops.aten


def _strategies(n_out: int, n_tensor_in: int, n_other_in: int) -> list:
    options = []
    for placement in (Replicate(), Shard(0), Shard(1)):
        options.append(([placement] * n_out, [placement] * n_tensor_in + [None] * n_other_in))
    return options


@register_sharding(aten._scaled_dot_product_flash_attention_for_cpu.default)
def _sdpa_cpu(query, key, value, dropout_p=0.0, is_causal=False, attn_mask=None, scale=None):
    if attn_mask is not None:  # a mask broadcasts over heads; keep it whole and replicate all
        return [([Replicate()] * 2, [Replicate()] * 3 + [None, None, Replicate(), None])]
    return _strategies(2, 3, 2)


@register_sharding(aten._scaled_dot_product_flash_attention_for_cpu_backward.default)
def _sdpa_cpu_backward(grad_out, query, key, value, out, logsumexp, dropout_p, is_causal, attn_mask=None, scale=None):
    if attn_mask is not None:
        return [([Replicate()] * 3, [Replicate()] * 6 + [None, None, Replicate(), None])]
    return _strategies(3, 6, 2)
