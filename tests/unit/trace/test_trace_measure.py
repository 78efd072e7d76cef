"""FLOPs against the closed form, saved activations against Korthikanti et al., and the
dataflow annotations the tensor-parallel legality check reads."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from autoplan.trace import trace, trace_model_file

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"


@pytest.fixture(scope="module")
def gpt():
    return trace_model_file(EXAMPLES / "gpt.py", 2)


def test_gpt_flops_match_megatron_closed_form(gpt):
    """Narayanan et al. SC'21 eq. 3 without recomputation: 72·B·s·l·h²·(1 + s/6h) for the
    layers plus 6·B·s·h·V for the logit layer (eq. 3 writes that term as V/16lh inside the
    96x bracket because the logit layer is never recomputed; with 72 it is V/12lh)."""
    B, s, h, l, V = 2, 512, 512, 4, 32000
    closed = 72 * B * s * l * h**2 * (1 + s / (6 * h)) + 6 * B * s * h * V
    assert abs(gpt.step_flops - closed) / closed < 0.02


def test_gpt_saved_activations_match_korthikanti(gpt):
    """Korthikanti et al. 2022 sec. 4: 34·s·b·h bytes (16-bit) + 5·a·s²·b per layer. Here
    dropout is 0 (no 1-byte masks: -2sbh) and SDPA is flash-style (no s² terms; it saves q, k,
    v, its output and a logsumexp), so 16·s·b·h elements remain, 64·s·b·h bytes in fp32, plus
    the LayerNorm statistics (2·b·s floats each) and the logsumexp (b·a·s floats)."""
    B, s, h, a = 2, 512, 512, 8
    for layer in gpt.layers:
        saved = sum(n.saved_bytes for n in gpt.layer_nodes(layer))
        stats = 4 * (2 * 2 * B * s + B * a * s)
        # saved bytes belong to the producer: each block holds its own output (what the next
        # block's ln_1 saves) and not its input, so every block counts exactly 16·s·b·h elements
        assert saved == 64 * s * B * h + stats


def test_sdpa_counted_on_cpu(gpt):
    attention = [n for n in gpt.nodes if n.op == "attention"]
    assert len(attention) == 4
    B, a, s, d = 2, 8, 512, 64
    for node in attention:
        assert node.fwd_flops == 4 * B * a * s * s * d
        assert node.bwd_flops == 2 * node.fwd_flops
        assert node.attrs["bwd_recompute_flops"] == 2 * B * a * s * s * d
        assert node.attrs | {"causal": True} == node.attrs and node.attrs["q_len"] == node.attrs["kv_len"] == s


def test_first_layer_has_no_input_gradient():
    """A linear fed raw data computes only its weight gradient: backward = forward, not 2x."""
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    graph = trace(model, (torch.randn(8, 16),))
    first, second = [n for n in graph.nodes if n.op == "linear"]
    assert first.fwd_flops == 2 * 8 * 16 * 32 and first.bwd_flops == first.fwd_flops
    assert second.bwd_flops == 2 * second.fwd_flops


def test_gpt_fused_qkv_annotations(gpt):
    c_attn = [n for n in gpt.nodes if n.module.endswith("attn.c_attn")]
    assert len(c_attn) == 4
    for node in c_attn:
        assert node.attrs["fused_chunks"] == 3
        assert node.attrs["attention"]["roles"] == ["q", "k", "v"]
        assert (node.attrs["attention"]["num_heads"], node.attrs["attention"]["head_dim"]) == (8, 64)
    assert all("attention" not in n.attrs for n in gpt.nodes if n.module.endswith(("c_proj", "c_fc")))


def test_llama_gqa_roles():
    graph = trace_model_file(EXAMPLES / "llama.py", 1)
    roles = {
        n.module.rsplit(".", 1)[-1]: n.attrs["attention"]
        for n in graph.layer_nodes("layers.0")
        if "attention" in n.attrs
    }
    assert {k: v["roles"] for k, v in roles.items()} == {"wq": ["q"], "wk": ["k"], "wv": ["v"]}
    assert all(v["num_heads"] == 8 and v["num_kv_heads"] == 2 and v["head_dim"] == 64 for v in roles.values())
    attention = next(n for n in graph.layer_nodes("layers.0") if n.op == "attention")
    assert attention.attrs["num_kv_heads"] == 2 and attention.attrs["num_kv_heads_at_call"] == 8


def test_moe_experts_annotated():
    """Experts held as a ModuleList (static routing, test_trace_moe.StaticMoE) get their index on every linear."""
    from test_trace_moe import StaticMoE

    with torch.device("meta"):
        model, x = nn.Sequential(StaticMoE()), torch.randn(64, 16)
    graph = trace(model, (x,), loss_fn=lambda out, target: out.sum())
    experts = [n for n in graph.nodes if "num_experts" in n.attrs]
    assert len(experts) == 4 * 2  # experts x linears
    assert sorted({n.attrs["expert"] for n in experts}) == [0, 1, 2, 3]
    assert all(n.attrs["num_experts"] == 4 and f"experts.{n.attrs['expert']}." in n.module for n in experts)


def test_fused_gate_up_chunks():
    class GatedMLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.gate_up, self.down = nn.Linear(16, 64), nn.Linear(32, 16)

        def forward(self, x):
            gate, up = self.gate_up(x).chunk(2, dim=-1)
            return self.down(F.silu(gate) * up)

    graph = trace(GatedMLP(), (torch.randn(4, 16),))
    assert graph.node("gate_up").attrs["fused_chunks"] == 2
    assert "fused_chunks" not in graph.node("down").attrs


def test_real_model_is_left_untouched():
    model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 2)).eval()
    before = [(p, p.data_ptr(), p.device) for p in model.parameters()]
    trace(model, (torch.randn(3, 8),))
    assert [(p, p.data_ptr(), p.device) for p in model.parameters()] == before
    assert not model.training


def test_data_dependent_routing_fails_clearly():
    class Router(nn.Module):
        def __init__(self):
            super().__init__()
            self.experts = nn.ModuleList([nn.Linear(8, 8), nn.Linear(8, 8)])

        def forward(self, x):
            out = torch.zeros_like(x)
            for i, expert in enumerate(self.experts):
                idx = (x[:, 0] > i).nonzero().squeeze(-1)
                out = out.index_add(0, idx, expert(x[idx]))
            return out

    from autoplan.errors import TraceError

    with pytest.raises(TraceError, match="nonzero"):
        trace(Router(), (torch.randn(4, 8),))


class _FailsWithoutGrad(torch.nn.Module):
    """Leaves autograd off when its forward fails, as a failing op inside set_grad_enabled(False) can."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)

    def forward(self, x):
        torch.set_grad_enabled(False)
        raise RuntimeError("this op cannot run on fake tensors")


def test_a_failed_trace_leaves_autograd_on():
    with pytest.raises(Exception):
        trace(_FailsWithoutGrad(), (torch.randn(2, 4),))
    assert torch.is_grad_enabled()
