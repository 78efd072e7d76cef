"""Mixture-of-Experts models trace as they are written, under the routing model (trace/moe.py)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import torch.nn as nn
from synthetic import canonical_graph

from autoplan.cli import main
from autoplan.errors import AutoplanError, TraceError
from autoplan.trace import trace, trace_model_file
from autoplan.types.graph import Graph
from autoplan.types.moe import DEFAULT_IMBALANCE, MoELayer, RoutingModel

transformers = pytest.importorskip("transformers")
EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
VOCAB, SEQ, HIDDEN = 256, 32, 64
COMMON = dict(vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=2, num_attention_heads=4)
COMMON.update(max_position_embeddings=SEQ, use_cache=False)
#: family -> (config class, model class, config sizes, experts, top-k, FFN width, shared module name or None)
FAMILIES = {
    "mixtral": (
        "MixtralConfig",
        "MixtralForCausalLM",
        dict(num_key_value_heads=2, intermediate_size=128, num_local_experts=4, num_experts_per_tok=2),
        4, 2, 128, None,
    ),
    "qwen2_moe": (
        "Qwen2MoeConfig",
        "Qwen2MoeForCausalLM",
        dict(num_key_value_heads=2, intermediate_size=128, moe_intermediate_size=32, num_experts=8,
             num_experts_per_tok=2, shared_expert_intermediate_size=64),
        8, 2, 32, "shared_expert",
    ),
    "deepseek_v3": (
        "DeepseekV3Config",
        "DeepseekV3ForCausalLM",
        dict(num_key_value_heads=4, intermediate_size=128, moe_intermediate_size=32, n_routed_experts=16,
             num_experts_per_tok=4, n_shared_experts=1, first_k_dense_replace=1, n_group=4, topk_group=2,
             kv_lora_rank=16, q_lora_rank=32, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16),
        16, 4, 32, "shared_experts",
    ),
}  # fmt: skip


def _model(family: str) -> nn.Module:
    config_name, model_name, sizes, *_ = FAMILIES[family]
    config = getattr(transformers, config_name)(**COMMON, **sizes)
    with torch.device("meta"):
        return getattr(transformers, model_name)(config)


def _trace(family: str, routing: RoutingModel | None = None, batch: int = 2) -> tuple[nn.Module, Graph]:
    model = _model(family)
    with torch.device("meta"):
        tokens = torch.randint(0, VOCAB, (batch, SEQ))
    return model, trace(model, (tokens,), model_name=family, routing=routing)


@pytest.fixture(scope="module")
def traced() -> dict[str, tuple[nn.Module, Graph]]:
    return {family: _trace(family) for family in FAMILIES}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_hf_moe_families_trace_with_default_configs(traced, family):
    model, graph = traced[family]
    *_, experts, top_k, ffn, shared = FAMILIES[family]
    moe_blocks = [name for name, m in model.named_modules() if hasattr(m, "experts") and hasattr(m, "gate")]
    assert [layer.module for layer in graph.moe_layers] == moe_blocks and moe_blocks  # DeepSeek: layer 0 is dense
    for layer in graph.moe_layers:
        assert (layer.num_experts, layer.top_k, layer.hidden_size, layer.expert_ffn_size) == (
            experts,
            top_k,
            HIDDEN,
            ffn,
        )
        assert layer.router_module == f"{layer.module}.gate" and layer.gated
        assert layer.shared_module == (f"{layer.module}.{shared}" if shared else None)
        assert layer.shared_params == (sum(p.numel() for p in model.get_submodule(layer.shared_module).parameters())
                                       if shared else 0)  # fmt: skip
        assert layer.tokens == 2 * SEQ and layer.slots_per_expert == math.ceil(2 * SEQ * top_k / experts)
        assert layer.layer is not None and layer.module.startswith(layer.layer + ".")
        assert set(layer.expert_param_names) <= set(graph.parameters)
        assert layer.params_per_expert * experts == sum(graph.parameters[p].numel for p in layer.expert_param_names)
        assert layer.routing.imbalance == DEFAULT_IMBALANCE and layer.routing.capacity_factor is None


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_routed_experts_do_the_balanced_work_on_their_own_weights(traced, family):
    """Forward FLOPs of a layer's experts are tokens * top_k * 6 * hidden * ffn (a gated FFN: gate
    and up, then down); the backward is twice that (input and weight gradients)."""
    _, graph = traced[family]
    for layer in graph.moe_layers:
        nodes = [n for n in graph.nodes if n.module.startswith(layer.experts_module)]
        expected = layer.num_experts * layer.slots_per_expert * 6 * layer.hidden_size * layer.expert_ffn_size
        assert sum(n.fwd_flops for n in nodes) == expected
        assert sum(n.bwd_flops for n in nodes) == 2 * expected
        assert {p for n in nodes for p in n.param_names} == set(layer.expert_param_names)


def test_the_users_model_is_left_as_it_was(traced):
    model, _ = traced["mixtral"]
    assert all("forward" not in m.__dict__ for m in model.modules())


def test_a_capacity_factor_pads_every_expert_to_its_capacity(traced):
    _, balanced = traced["mixtral"]  # _trace("mixtral") under the default routing model: dropless
    _, padded = _trace("mixtral", RoutingModel(capacity_factor=1.5))
    base, layer = balanced.moe_layers[0], padded.moe_layers[0]
    assert layer.slots_per_expert == math.ceil(1.5 * base.tokens * base.top_k / base.num_experts)
    assert layer.routing.capacity_factor == 1.5

    def flops(graph):
        return sum(n.fwd_flops for n in graph.nodes if n.module.startswith(layer.experts_module))

    assert flops(padded) == pytest.approx(flops(balanced) * layer.slots_per_expert / base.slots_per_expert)


def test_the_moe_example_is_traced_through_the_experts_interface():
    """examples/moe.py routes dropless in plain torch through experts in the Hugging Face interface
    (non-gated GELU, 3-D up_proj/down_proj): the stand-in runs them under the routing model, the
    router and top-k come from the block, and the experts do tokens * top_k * 4 * hidden * ffn
    forward FLOPs (up and down, no gate), backward twice that."""
    from autoplan.trace.moe import is_hf_experts

    graph = trace_model_file(EXAMPLES / "moe.py", 2)
    assert len(graph.moe_layers) == 2
    layer = graph.moe_layers[0]
    assert (layer.module, layer.experts_module, layer.router_module) == ("layers.0.moe", "layers.0.moe.experts",
                                                                         "layers.0.moe.router")  # fmt: skip
    assert (layer.num_experts, layer.top_k, layer.gated, layer.interface) == (4, 2, False, "grouped")
    assert (layer.hidden_size, layer.expert_ffn_size) == (256, 1024)
    assert layer.expert_param_names == ["layers.0.moe.experts.up_proj", "layers.0.moe.experts.down_proj"]
    tokens = 2 * 128
    assert layer.tokens == tokens and layer.slots_per_expert == math.ceil(tokens * 2 / 4)  # dropless, balanced
    nodes = [n for n in graph.nodes if n.module.startswith(layer.experts_module)]
    expected = layer.num_experts * layer.slots_per_expert * 4 * layer.hidden_size * layer.expert_ffn_size
    assert sum(n.fwd_flops for n in nodes) == expected and sum(n.bwd_flops for n in nodes) == 2 * expected
    from autoplan.modelfile import load_model_file

    assert is_hf_experts(load_model_file(EXAMPLES / "moe.py").build().layers[0].moe.experts)


class StaticMoE(nn.Module):
    """GShard/Switch-style routing with a fixed capacity, written with one-hot dispatch and combine
    einsums (what examples/moe.py was before it became dropless): every shape is static."""

    def __init__(self, dim: int = 16, experts: int = 4, top_k: int = 2, capacity_factor: float = 1.25):
        super().__init__()
        self.experts_count, self.choices, self.capacity_factor = experts, top_k, capacity_factor  # no top_k attribute
        self.router = nn.Linear(dim, experts, bias=False)
        self.experts = nn.ModuleList(
            nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim)) for _ in range(experts)
        )

    def forward(self, x):
        S, E = x.shape[0], self.experts_count
        capacity = math.ceil(self.capacity_factor * S * self.choices / E)
        weights, chosen = torch.softmax(self.router(x), dim=-1).topk(self.choices, dim=-1)
        onehot = nn.functional.one_hot(chosen, E).to(x.dtype)  # [S, k, E]
        position = (torch.cumsum(onehot.reshape(-1, E), dim=0).reshape(S, self.choices, E) - 1) * onehot
        keep = onehot * (position < capacity).to(x.dtype)
        slots = nn.functional.one_hot(position.long().clamp(0, capacity - 1), capacity).to(x.dtype)
        slots = slots * keep.unsqueeze(-1)
        expert_in = torch.einsum("sec,sd->ecd", slots.sum(1), x)
        expert_out = torch.stack([expert(expert_in[i]) for i, expert in enumerate(self.experts)])
        return torch.einsum("sec,ecd->sd", (slots * weights[..., None, None]).sum(1), expert_out)


def test_static_routing_is_recorded_as_written():
    """Routing with a fixed capacity in one-hot einsums traces as written; its ModuleList experts,
    router and top-k (read from its topk call) are recorded."""
    with torch.device("meta"):
        model, x = nn.Sequential(StaticMoE()), torch.randn(64, 16)
    graph = trace(model, (x,), loss_fn=lambda out, target: out.sum())
    layer = graph.moe_layers[0]
    assert (layer.module, layer.experts_module, layer.router_module) == ("0", "0.experts", "0.router")
    assert (layer.num_experts, layer.top_k, layer.gated, layer.interface) == (4, 2, False, "module_list")
    assert layer.slots_per_expert == math.ceil(1.25 * 64 * 2 / 4)  # the capacity factor


def test_graph_json_keeps_the_moe_layers(traced, tmp_path):
    _, graph = traced["qwen2_moe"]
    loaded = Graph.load(graph.save(tmp_path / "graph.json"))
    assert [layer.to_dict() for layer in loaded.moe_layers] == [layer.to_dict() for layer in graph.moe_layers]
    assert all(isinstance(layer, MoELayer) for layer in loaded.moe_layers)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(imbalance=0.9), "MoE imbalance 0.9 must be a number >= 1"),
        (dict(capacity_factor=0.0), "MoE capacity factor 0.0 must be a positive number"),
    ],
)
def test_a_routing_model_out_of_range_is_one_sentence(kwargs, message):
    with pytest.raises(AutoplanError, match=message):
        RoutingModel(**kwargs)


def test_cli_reports_moe_layers_and_refuses_bad_routing(tmp_path, capsys):
    args = ["trace", str(EXAMPLES / "hf_mixtral.py"), "--batch", "2", "--out", str(tmp_path), "--json"]
    assert main(args + ["--moe-capacity-factor", "2"]) == 0
    out = capsys.readouterr().out
    assert '"moe_layers"' in out and "8 experts top-2" in out and '"capacity_factor": 2.0' in out
    assert main(args + ["--moe-imbalance", "0.5"]) != 0
    assert "MoE imbalance 0.5 must be a number >= 1" in capsys.readouterr().err


class DataDependentMoE(nn.Module):
    """Experts in a ModuleList, routed with nonzero(): shapes only real data can size."""

    def __init__(self):
        super().__init__()
        self.router = nn.Linear(8, 4)
        self.experts = nn.ModuleList(nn.Linear(8, 8) for _ in range(4))

    def forward(self, x):
        chosen = self.router(x).argmax(-1)
        out = torch.zeros_like(x)
        for e, expert in enumerate(self.experts):
            rows = (chosen == e).nonzero().squeeze(-1)
            out = out.index_add(0, rows, expert(x[rows]))
        return out


def test_routing_it_cannot_interpret_names_the_op_and_module():
    with torch.device("meta"):
        model, x = DataDependentMoE(), torch.randn(16, 8)
    with pytest.raises(TraceError, match=r"nonzero.*(depends on tensor values|Mixture-of-Experts)"):
        trace(model, (x,), loss_fn=lambda out, target: out.sum())


SMALL_DSV3 = dict(LAYERS=9, DENSE=2, DIM=64, HEADS=4, FFN=128, MOE_FFN=32, EXPERTS=16, TOP_K=4, VOCAB=256, SEQ=32)


def test_deepseek_v3_example_stitches_its_moe_run_after_the_dense_layers(monkeypatch):
    """examples/hf_deepseek_v3.py (small sizes): two dense layers, then seven MoE ones. The export
    keeps the dense layers and three MoE ones and copies the rest (trace/stitch.py); the graph
    equals the full export's node for node."""
    import autoplan.trace.capture as capture

    for name, value in SMALL_DSV3.items():
        monkeypatch.setenv(f"AUTOPLAN_HF_DSV3_{name}", str(value))
    real, used = capture._try_stitched_export, []
    monkeypatch.setattr(capture, "_try_stitched_export", lambda m, i: used.append(real(m, i)) or used[-1])
    stitched = trace_model_file(EXAMPLES / "hf_deepseek_v3.py", 2)
    monkeypatch.setattr(capture, "_try_stitched_export", lambda m, i: None)
    full = trace_model_file(EXAMPLES / "hf_deepseek_v3.py", 2)
    assert used and used[0] is not None
    assert [layer.module for layer in stitched.moe_layers] == [f"model.layers.{i}.mlp" for i in range(2, 9)]
    assert canonical_graph(stitched) == canonical_graph(full)


def test_plan_traces_under_the_routing_model_it_is_given(tmp_path, capsys, monkeypatch):
    """`autoplan plan` takes the same routing flags: its plan folder's graph.json records them."""
    for name, value in dict(LAYERS=1, DIM=64, HEADS=4, FFN=128, EXPERTS=4, VOCAB=256, SEQ=32).items():
        monkeypatch.setenv(f"AUTOPLAN_HF_MIXTRAL_{name}", str(value))
    args = ["plan", str(EXAMPLES / "hf_mixtral.py"), "--devices", "2", "--profile", "dgx-a100", "--batch", "4"]
    assert main(args + ["--out", str(tmp_path), "--quiet", "--moe-capacity-factor", "1.5"]) == 0
    layer = Graph.load(tmp_path / "graph.json").moe_layers[0]
    assert layer.routing.capacity_factor == 1.5 and layer.slots_per_expert == math.ceil(1.5 * 4 * 32 * 2 / 4)
    capsys.readouterr()
    assert main(args + ["--out", str(tmp_path / "bad"), "--moe-capacity-factor", "-1"]) != 0
    assert "MoE capacity factor -1.0 must be a positive number" in capsys.readouterr().err


class TwoBlocksTwoClasses(nn.Module):
    """Two alike blocks beside a head with one output per block: the shape of a router beside its experts, but
    nothing picks a block per token."""

    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(nn.Linear(8, 8) for _ in range(2))
        self.head = nn.Linear(8, 2)

    def forward(self, x):
        for block in self.blocks:
            x = torch.tanh(block(x))
        return self.head(x)


def test_blocks_beside_a_head_with_one_output_each_are_not_an_moe_layer():
    """Taken for an MoE layer whose top-k could not be found, the model was refused."""
    graph = trace(TwoBlocksTwoClasses(), (torch.randn(4, 8),))
    assert graph.moe_layers == [] and graph.layers == ["blocks.0", "blocks.1"]
