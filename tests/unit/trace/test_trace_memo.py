"""Replaying identical calls (autoplan.trace.memo) records exactly what measuring every node
records, measures each distinct call once, and never replays a call it cannot vouch for."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.fx
import torch.nn as nn
import torch.nn.functional as F

from autoplan.trace import propagate, trace, trace_model_file

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
CALLS = {"count": 0}


def _counted_scale(x: torch.Tensor) -> torch.Tensor:
    """A user function with a side effect: it must run for every node that calls it."""
    CALLS["count"] += 1
    return x * 2


torch.fx.wrap("_counted_scale")


class _TrickyBlock(nn.Module):
    """Chunked outputs, an in-place op, a parameter view with autograd history, a Python int
    from a size, a dropout mask and a user function: every replay path in one block."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.proj = nn.Linear(width, 2 * width)
        self.weight = nn.Parameter(torch.randn(width, width))
        self.drop = nn.Dropout(0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, b = self.proj(self.norm(x)).chunk(2, dim=-1)
        y = torch.relu_(a.clone()) * b
        z = F.linear(self.drop(y), self.weight.t())
        return x + _counted_scale(z.transpose(0, 1).contiguous().transpose(0, 1)) / x.size(-1)


class _TrickyModel(nn.Module):
    def __init__(self, width: int = 16, vocab: int = 50, depth: int = 3) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.blocks = nn.ModuleList(_TrickyBlock(width) for _ in range(depth))
        self.head = nn.Linear(width, vocab, bias=False)
        self.head.weight = self.embed.weight  # tied

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def _both(monkeypatch, build):
    monkeypatch.setattr(propagate, "MEMOIZE", False)
    measured = build().to_dict()
    monkeypatch.setattr(propagate, "MEMOIZE", True)
    return measured, build().to_dict()


@pytest.mark.parametrize("name", ["gpt", "llama", "moe", "resnet", "vit", "hf_gpt2"])
def test_replay_equals_measuring_every_node(monkeypatch, name):
    if name.startswith("hf_"):
        pytest.importorskip("transformers")
    measured, replayed = _both(monkeypatch, lambda: trace_model_file(EXAMPLES / f"{name}.py", 2))
    assert replayed == measured


def test_replay_equals_measuring_on_tricky_calls(monkeypatch):
    torch.manual_seed(0)
    model = _TrickyModel()
    tokens = torch.randint(0, 50, (4, 8))
    measured, replayed = _both(monkeypatch, lambda: trace(model, (tokens,)))
    assert replayed == measured
    assert sum(n["saved_bytes"] for n in replayed["nodes"]) > 0


def test_user_function_runs_for_every_node():
    model = _TrickyModel(depth=3)
    CALLS["count"] = 0
    trace(model, (torch.randint(0, 50, (4, 8)),))
    assert CALLS["count"] == 3


def test_distinct_calls_are_measured_once(monkeypatch):
    """Doubling a GPT's depth adds nodes but no real measurements."""
    counts = {}
    original = propagate.Propagator._measure

    def counting(self, *args, **kwargs):
        counts[depth] = counts.get(depth, 0) + 1
        return original(self, *args, **kwargs)

    monkeypatch.setattr(propagate.Propagator, "_measure", counting)
    nodes = {}
    for depth in (2, 4):
        monkeypatch.setenv("AUTOPLAN_GPT_N_LAYER", str(depth))
        nodes[depth] = len(trace_model_file(EXAMPLES / "gpt.py", 2).nodes)
    assert nodes[4] > nodes[2]
    assert counts[4] == counts[2] < nodes[2]


_SMALL_DSV3 = {"DENSE": 1, "DIM": 64, "HEADS": 4, "FFN": 128, "MOE_FFN": 32, "EXPERTS": 16, "TOP_K": 4, "VOCAB": 256}


def _small_deepseek_v3(monkeypatch, layers: int):
    for name, value in {**_SMALL_DSV3, "LAYERS": layers, "SEQ": 32}.items():
        monkeypatch.setenv(f"AUTOPLAN_HF_DSV3_{name}", str(value))
    return trace_model_file(EXAMPLES / "hf_deepseek_v3.py", 4)


def test_replay_equals_measuring_on_moe_expert_weights(monkeypatch):
    """A small DeepSeek-V3 (3 MoE layers): its experts' weight transposes and the grouped bmms
    reading them (parameter views with autograd history) replay to the same graph."""
    pytest.importorskip("transformers")
    measured, replayed = _both(monkeypatch, lambda: _small_deepseek_v3(monkeypatch, 4))
    assert replayed == measured
    assert sum(n["target"] == "aten.bmm.default" for n in replayed["nodes"]) == 6


def test_moe_expert_weights_are_measured_once(monkeypatch):
    """More MoE layers add no real measurements: the expert weights' views and the bmms reading
    them replay from the first MoE layer."""
    pytest.importorskip("transformers")
    counts: dict[int, int] = {}
    original = propagate.Propagator._measure

    def counting(self, *args, **kwargs):
        counts[layers] = counts.get(layers, 0) + 1
        return original(self, *args, **kwargs)

    monkeypatch.setattr(propagate.Propagator, "_measure", counting)
    for layers in (3, 4):
        _small_deepseek_v3(monkeypatch, layers)
    assert counts[4] == counts[3]
