"""An export records no stack traces (trace/capture.py, _stack_traces): the graph is the same, and a node
that fails on fake tensors is still named with its source line (trace() exports again with them)."""

import contextlib

import pytest
import torch
import torch.nn as nn

import autoplan.trace.capture as capture
from autoplan.errors import TraceError
from autoplan.trace import trace


class Branchy(nn.Module):
    """Python branching on a shape: torch.fx fails on it, torch.export runs it."""

    def __init__(self, nonzero: bool = False):
        super().__init__()
        self.proj, self.nonzero = nn.Linear(4, 4), nonzero

    def forward(self, x):
        if x.shape[0] > 1:
            x = self.proj(x)
        if self.nonzero:
            return x.nonzero().float().sum() + x.sum()  # FAILS HERE on fake tensors
        return torch.relu(x)


def _traced(model: nn.Module) -> dict:
    with torch.device("meta"):
        x = torch.randn(8, 4)
    return trace(model, (x,), loss_fn=lambda out, target: out.sum()).to_dict()


def _exports(monkeypatch) -> list[set[str]]:
    """Each export's nodes that carry a stack trace."""
    real, seen = capture._try_export, []

    def spy(model, meta_inputs):
        found = real(model, meta_inputs)
        seen.append({n.name for n in found.module.graph.nodes if n.meta.get("stack_trace")})
        return found

    monkeypatch.setattr(capture, "_try_export", spy)
    return seen


def test_an_export_keeps_no_stack_traces_and_gives_the_same_graph(monkeypatch):
    seen = _exports(monkeypatch)
    graph = _traced(Branchy())
    assert seen == [set()]
    monkeypatch.setattr(capture, "_stack_traces", lambda enabled: contextlib.nullcontext())  # recorded, as before
    assert _traced(Branchy()) == graph
    assert seen[1] >= {"linear", "relu"}


def test_a_node_that_fails_is_named_with_its_source_line(monkeypatch):
    seen = _exports(monkeypatch)
    line = next(i for i, text in enumerate(open(__file__).read().splitlines(), 1) if "FAILS HERE" in text)
    with pytest.raises(TraceError, match=rf"op 'aten.nonzero.default' .* at test_trace_source_lines.py:{line} "):
        _traced(Branchy(nonzero=True))
    assert len(seen) == 2 and "nonzero" not in seen[0] and "nonzero" in seen[1]  # the second one names the line


class MaskedTransformer(torch.nn.Module):
    """torch's nn.Transformer given a causal tgt_mask: it checks whether the mask is causal on its values."""

    def __init__(self):
        super().__init__()
        self.tf = torch.nn.Transformer(d_model=16, nhead=2, num_encoder_layers=1, num_decoder_layers=1)

    def forward(self, src, tgt):
        mask = torch.nn.Transformer.generate_square_subsequent_mask(tgt.shape[0])
        return self.tf(src, tgt, tgt_mask=mask)


def test_a_branch_on_values_inside_torch_names_the_module_and_torchs_line():
    """It read: op 'module' ... (data-dependent routing such as nonzero()), as if it were MoE routing. torch's
    nn.Transformer is traced through (not one node), so the export names the decoder and torch's check."""
    with pytest.raises(TraceError) as caught:
        trace(MaskedTransformer(), (torch.randn(5, 2, 16), torch.randn(4, 2, 16)))
    said = str(caught.value)
    assert "in module 'tf.decoder'" in said and "(_detect_is_causal_mask)" in said
    assert "tgt_is_causal=True" in said and "\n" not in said


class MaskWithoutDevice(torch.nn.Module):
    """A mask made in forward() without device=: on the CPU beside autoplan's meta tensors."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(8, 8)

    def forward(self, x):
        mask = torch.ones(x.shape[1], x.shape[1], dtype=torch.bool).tril()
        return self.proj(x).masked_fill(~mask[:, :8], 0.0)


def test_a_tensor_made_without_device_is_refused_with_that_advice():
    with pytest.raises(TraceError, match=r"without device=.*make it with device=x.device"):
        trace(MaskWithoutDevice(), (torch.randn(2, 8, 8),))
