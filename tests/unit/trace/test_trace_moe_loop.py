"""MoE layers written as a loop over their experts trace under the routing model (trace/moe_loop.py)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from autoplan.cost.tp.splits import legal_splits
from autoplan.errors import PlanError, TraceError
from autoplan.solve.api import plan_graph
from autoplan.trace import trace, trace_model_file
from autoplan.types.graph import within
from autoplan.types.moe import RoutingModel

LOOP_MOE = Path(__file__).resolve().parents[2] / "odd_models" / "loop_moe.py"
DIM, FFN, EXPERTS, TOP_K, TOKENS = 16, 32, 4, 2, 64


class SwiGLU(nn.Module):
    def __init__(self, ffn: int = FFN):
        super().__init__()
        self.gate_proj, self.up_proj = nn.Linear(DIM, ffn, bias=False), nn.Linear(DIM, ffn, bias=False)
        self.down_proj = nn.Linear(ffn, DIM, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class LoopMoE(nn.Module):
    """The common parts: a router ``gate``, a ModuleList of alike experts, a top-k."""

    def __init__(self):
        super().__init__()
        self.num_experts, self.top_k = EXPERTS, TOP_K
        self.gate = nn.Linear(DIM, EXPERTS, bias=False)
        self.experts = nn.ModuleList(SwiGLU() for _ in range(EXPERTS))

    def route(self, x):
        weights, chosen = torch.topk(F.softmax(self.gate(x), dim=-1), self.top_k, dim=-1)
        return weights / weights.sum(-1, keepdim=True), chosen


class ExpertHitMoE(LoopMoE):
    """transformers 4.48+ Mixtral / Qwen3-MoE: loop over the experts that got tokens, indexing the
    ModuleList with a tensor."""

    def forward(self, x):
        weights, chosen = self.route(x)
        out = torch.zeros_like(x)
        mask = F.one_hot(chosen, num_classes=self.num_experts).permute(2, 1, 0)
        expert_hit = torch.greater(mask.sum(dim=(-1, -2)), 0).nonzero()
        for expert_idx in expert_hit:
            expert = self.experts[expert_idx]
            idx, top_x = torch.where(mask[expert_idx].squeeze(0))
            out.index_add_(0, top_x, expert(x[None, top_x].reshape(-1, DIM)) * weights[top_x, idx, None])
        return out


class MaskedStoreMoE(LoopMoE):
    """DeepSeek-MoE's training path: tokens repeated per choice, boolean-mask reads and stores."""

    def forward(self, x):
        weights, chosen = self.route(x)
        flat = chosen.view(-1)
        repeated = x.repeat_interleave(self.top_k, dim=0)
        y = torch.empty_like(repeated)
        for i, expert in enumerate(self.experts):
            y[flat == i] = expert(repeated[flat == i])
        return (y.view(*weights.shape, -1) * weights.unsqueeze(-1)).sum(dim=1)


class SharedExpertMoE(LoopMoE):
    """Qwen2-MoE in transformers 4.x: ``nonzero`` per expert beside a gated shared expert."""

    def __init__(self):
        super().__init__()
        self.shared_expert, self.shared_expert_gate = SwiGLU(2 * FFN), nn.Linear(DIM, 1, bias=False)

    def forward(self, x):
        weights, chosen = self.route(x)
        out = torch.zeros_like(x)
        for e in range(self.num_experts):
            token, choice = (chosen == e).nonzero(as_tuple=True)
            out.index_add_(0, token, self.experts[e](x[token]) * weights[token, choice, None])
        return out + torch.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)


VARIANTS = {"expert_hit": ExpertHitMoE, "masked_store": MaskedStoreMoE, "shared_expert": SharedExpertMoE}


def _trace(cls, routing: RoutingModel | None = None):
    with torch.device("meta"):
        model, x = nn.Sequential(nn.Linear(DIM, DIM), cls()), torch.randn(TOKENS, DIM)  # the layer's input needs grad
    return model, trace(model, (x,), loss_fn=lambda out, target: out.sum(), routing=routing)


def _expert_flops(graph, layer) -> tuple[int, int]:
    nodes = [n for n in graph.nodes if within(n.module, layer.experts_module)]
    return sum(n.fwd_flops for n in nodes), sum(n.bwd_flops for n in nodes)


@pytest.fixture(scope="module")
def loop_graph():
    return trace_model_file(LOOP_MOE, 2)


def test_a_loop_over_experts_is_recorded_as_an_moe_layer(loop_graph):
    """tests/odd_models/loop_moe.py (Mixtral as transformers 4.x wrote it: ``torch.where`` per
    expert and ``continue`` when it got none) traces; each layer is found by its structure."""
    assert [m.module for m in loop_graph.moe_layers] == ["layers.0.moe", "layers.1.moe"]
    layer = loop_graph.moe_layers[0]
    assert (layer.experts_module, layer.router_module, layer.interface) == (
        "layers.0.moe.experts",
        "layers.0.moe.gate",
        "module_list",
    )
    shape = (layer.num_experts, layer.top_k, layer.hidden_size, layer.expert_ffn_size, layer.gated)
    assert shape == (4, 2, 32, 64, True)
    tokens = 2 * 16
    assert layer.tokens == tokens and layer.slots_per_expert == math.ceil(tokens * 2 / 4) and layer.data_dependent
    assert layer.layer == "layers.0" and loop_graph.layers == ["layers.0", "layers.1"]


def test_each_expert_runs_on_its_balanced_share_of_the_rows(loop_graph):
    """Forward FLOPs of the experts: E * C * 6 * hidden * ffn (gate, up and down GEMMs on C rows
    each); backward twice that (input and weight gradients)."""
    for layer in loop_graph.moe_layers:
        expected = layer.num_experts * layer.slots_per_expert * 6 * layer.hidden_size * layer.expert_ffn_size
        assert _expert_flops(loop_graph, layer) == (expected, 2 * expected)


def test_the_layers_linears_are_kept_whole_under_tensor_parallelism(loop_graph):
    """DTensor cannot route a loop over experts, so the executor runs these layers whole on each
    tp rank (execute/expert_loop.py); the planner never splits their router or experts."""
    inside = [n for n in loop_graph.nodes if n.op == "linear" and within(n.module, "layers.0.moe")]
    assert len(inside) == 1 + 4 * 3
    assert all(legal_splits(n, 2) == ("replicate",) for n in inside)
    qkv = next(n for n in loop_graph.nodes if n.module == "layers.0.qkv")
    assert "colwise" in legal_splits(qkv, 2)


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_other_ways_of_writing_the_loop_trace_to_the_same_expert_work(name):
    model, graph = _trace(VARIANTS[name])
    (layer,) = graph.moe_layers
    slots = math.ceil(TOKENS * TOP_K / EXPERTS)
    assert (layer.num_experts, layer.top_k, layer.tokens, layer.slots_per_expert) == (EXPERTS, TOP_K, TOKENS, slots)
    assert layer.data_dependent and layer.router_module == "1.gate"
    expected = EXPERTS * slots * 6 * DIM * FFN
    assert _expert_flops(graph, layer) == (expected, 2 * expected)
    assert all("forward" not in m.__dict__ for m in model.modules())  # the user's model is left as it was
    if name == "shared_expert":
        assert layer.shared_module == "1.shared_expert"


def test_a_capacity_factor_gives_each_expert_its_capacity_of_rows():
    _, balanced = _trace(SharedExpertMoE)
    _, padded = _trace(SharedExpertMoE, RoutingModel(capacity_factor=1.5))
    layer = padded.moe_layers[0]
    assert layer.slots_per_expert == math.ceil(1.5 * TOKENS * TOP_K / EXPERTS)
    ratio = layer.slots_per_expert / balanced.moe_layers[0].slots_per_expert
    assert _expert_flops(padded, layer)[0] == pytest.approx(_expert_flops(balanced, layer)[0] * ratio)


def test_the_planner_keeps_a_data_dependent_layer_off_pipelines(loop_graph):
    """torch.export, which splits pipelines, cannot capture the loop: pp = 1 only, and a pin is
    one sentence naming the layer."""
    result = plan_graph(loop_graph, devices=2, profile="cpu-gloo")
    assert result.best.pp == 1 and all(c.config["pp"] == 1 for c in result.candidates)
    with pytest.raises(PlanError, match=r"--fix pp=2 cannot split this model: MoE layer 'layers.0.moe' loops"):
        plan_graph(loop_graph, devices=2, profile="cpu-gloo", fix="pp=2")


class CountsNonzero(nn.Module):
    """Data-dependent control flow that is no MoE layer: not recognised, so still refused."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(DIM, DIM)

    def forward(self, x):
        keep = (x.sum(-1) > 0).nonzero()
        return self.proj(x) if keep.numel() else x


def test_data_dependent_code_outside_an_moe_layer_still_names_its_line():
    with torch.device("meta"):
        model, x = CountsNonzero(), torch.randn(TOKENS, DIM)
    with pytest.raises(TraceError, match=r"test_trace_moe_loop.py:\d+ \(`return self.proj\(x\) if keep.numel\(\)"):
        trace(model, (x,), loss_fn=lambda out, target: out.sum())


# ---- the command line ------------------------------------------------------------------------
LATE_BRANCH = '''
import torch
import torch.nn as nn


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 16)

    def forward(self, x):
        return x + torch.relu(self.fc(x))


class LateBranch(nn.Module):
    """Many alike blocks, then a branch on tensor values after them: no MoE layer."""

    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(Block() for _ in range(8))

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        kept = (x.sum(-1) > 0).nonzero()
        if kept.numel() == 0:
            return x * 0
        return x


def build_model():
    return LateBranch()


def example_inputs(batch_size):
    return (torch.randn(batch_size, 16),)
'''


def test_cli_plans_a_loop_moe_model_without_pipelines_and_refuses_a_pp_pin(tmp_path, capsys):
    from autoplan.cli import main
    from autoplan.types.graph import Graph
    from autoplan.types.plan import Plan

    args = ["plan", str(LOOP_MOE), "--devices", "2", "--profile", "cpu-gloo", "--batch", "8", "--quiet"]
    assert main(args + ["--out", str(tmp_path / "plan")]) == 0
    assert Plan.load(tmp_path / "plan" / "plan.json").pp == 1
    assert all(m.data_dependent for m in Graph.load(tmp_path / "plan" / "graph.json").moe_layers)
    capsys.readouterr()
    assert main(args + ["--fix", "pp=2", "--out", str(tmp_path / "pinned")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("autoplan: error: --fix pp=2 cannot split this model: MoE layer 'layers.0.moe'")
    assert "Traceback" not in "\n".join(err)


def test_cli_refuses_data_dependent_control_flow_after_one_export(tmp_path, capsys, monkeypatch):
    """The stitched export (three of the eight blocks) stops at the branch; the full export would
    run the same code and stop there too, after every block, so it is not run."""
    from autoplan.cli import main

    path = tmp_path / "late_branch.py"
    path.write_text(LATE_BRANCH)
    real, exports = torch.export.export, []
    monkeypatch.setattr(torch.export, "export", lambda *a, **k: exports.append(1) or real(*a, **k))
    assert main(["trace", str(path), "--batch", "4", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    line = LATE_BRANCH.splitlines().index("        if kept.numel() == 0:") + 1
    assert f"late_branch.py:{line} (`if kept.numel() == 0:`)" in err and "GuardOnDataDependentSymNode" in err
    assert len(exports) == 1
