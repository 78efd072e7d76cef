"""A parametrized weight (torch.nn.utils.parametrizations.weight_norm) traces: FlopCounterMode's module tracker,
whose backward hooks raised on the parametrization's leaf inside autograd.grad, is not used (trace/flops.py)."""

from __future__ import annotations

import torch
import torch.nn as nn
from torch.nn.utils.parametrizations import weight_norm

from autoplan.trace import trace


class Block(nn.Module):
    def __init__(self, parametrized: bool):
        super().__init__()
        self.fc = weight_norm(nn.Linear(16, 32)) if parametrized else nn.Linear(16, 32)

    def forward(self, x):
        return torch.relu(self.fc(x)).sum(-1, keepdim=True) + x


def test_weight_norm_traces_with_its_linears_flops():
    x = (torch.randn(4, 16),)
    plain = trace(nn.Sequential(Block(False), Block(False)), x)
    normed = trace(nn.Sequential(Block(True), Block(True)), x)
    matmul = 2 * 4 * 16 * 32
    assert sum(n.fwd_flops for n in plain.nodes) == 2 * matmul
    assert sum(n.fwd_flops for n in normed.nodes) >= 2 * matmul  # the linears, and the norm's own work
    assert {p for p in normed.parameters if "original" in p} == {
        f"{i}.fc.parametrizations.weight.original{j}" for i in (0, 1) for j in (0, 1)
    }


class ThreeDimAttention(nn.Module):
    """SDPA on [batch, seq, dim] tensors (no heads dim), which torch accepts."""

    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(16, 48)

    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)


def test_attention_on_three_dim_tensors_traces_with_its_recompute_flops():
    """It refused the model: 'not enough values to unpack (expected 4, got 3)'."""
    graph = trace(ThreeDimAttention(), (torch.randn(2, 5, 16),))
    attention = next(n for n in graph.nodes if n.op == "attention")
    assert attention.attrs["bwd_recompute_flops"] == 2 * 2 * 5 * 5 * 16


def test_a_parametrizations_backward_is_measured_and_tp_refused_where_dtensor_cannot_run_it():
    """fx calls the parametrization with its parameters as arguments (get_attr), whose gradient the node measured
    nowhere: the backward (aten._weight_norm_interface_backward, which DTensor cannot run) went unseen, the planner
    offered tp = 2, and every rank stopped at the first step."""
    from autoplan.errors import PlanError
    from autoplan.solve.api import plan_graph

    graph = trace(nn.Sequential(Block(True), Block(True)), (torch.randn(8, 16),))
    norm = next(n for n in graph.nodes if n.module == "0.fc.parametrizations.weight.0")
    assert "aten._weight_norm_interface_backward.default" in norm.attrs["dtensor_lacks"]
    try:
        plan_graph(graph, devices=2, profile="cpu-gloo", fix="tp=2")
    except PlanError as refused:
        assert "_weight_norm_interface_backward" in str(refused) and "use tp=1" in str(refused)
    else:
        raise AssertionError("tp=2 was planned")
