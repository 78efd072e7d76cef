"""A bare parameter contracted by torch.einsum (HF XLNet's projections: ``einsum("ibh,hnd->ibnd", h, self.q)``) is
a linear node whose features come from the equation, both when torch.fx traces the model and when torch.export does
(aten's einsum takes its operands as one list: the planner stopped with "internal error: StopIteration")."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from autoplan.solve.api import plan_graph
from autoplan.trace import trace


class Projection(nn.Module):
    def __init__(self, exported: bool):
        super().__init__()
        self.q = nn.Parameter(torch.randn(64, 4, 16) * 0.02)  # [hidden, heads, head_dim]
        self.out = nn.Linear(64, 64)
        self.exported = exported

    def forward(self, x):
        if self.exported and x.dtype == torch.float64:  # a branch on a dtype: torch.fx cannot trace it
            x = x.float()
        h = torch.einsum("ibh,hnd->ibnd", x.transpose(0, 1), self.q).transpose(0, 1)
        return self.out(h.reshape(x.shape[0], x.shape[1], 64))


@pytest.mark.parametrize("exported", [False, True])
def test_an_einsum_weight_is_a_linear_of_its_contracted_and_kept_dims(exported):
    graph = trace(Projection(exported), (torch.randn(4, 8, 64),))
    assert graph.trace_method == ("export" if exported else "fx")
    (einsum,) = [n for n in graph.nodes if n.op == "linear" and "q" in n.param_names]
    assert (einsum.attrs["in_features"], einsum.attrs["out_features"]) == (64, 4 * 16)
    assert einsum.fwd_flops == 2 * 4 * 8 * 64 * 64
    assert einsum.attrs["tp_splittable"] is False  # the executor splits 2-D weights only
    plan = plan_graph(graph, devices=2, profile="cpu-gloo", fix="tp=2").best
    assert plan.tp_plan.get(einsum.name, "replicate") == "replicate"
