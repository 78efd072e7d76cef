"""A forward() that assigns to its module (Meta's original Llama code: ``self.freqs_cis = self.freqs_cis.to(h.device)``)
traces: torch.fx runs forward() on the model, and what it assigned is put back before the graph or torch.export
reads the model (trace/capture.py ``_put_back``). Before, the plan stopped with an internal AttributeError (fx
traced it) or torch.export met fx's Proxy in the model (fx could not)."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from autoplan.trace import trace
from autoplan.trace.capture import first_line


class Scaled(nn.Module):
    def __init__(self, fx_traceable: bool):
        super().__init__()
        self.a, self.b = nn.Linear(16, 16), nn.Linear(16, 4)
        self.scale = torch.linspace(0.5, 1.5, 16)  # a plain tensor attribute, not a buffer
        self.fx_traceable = fx_traceable

    def forward(self, x):
        self.scale = self.scale.to(x.device)
        h = self.a(x) * self.scale
        if not self.fx_traceable:
            h = h.reshape(*h.shape[:-1], 4, 4).flatten(-2)  # iterating a shape: torch.fx cannot trace it
        return self.b(h)


@pytest.mark.parametrize("fx_traceable", [True, False])
def test_a_forward_that_assigns_to_its_module_traces_and_leaves_it_as_it_was(fx_traceable):
    model = Scaled(fx_traceable)
    graph = trace(model, (torch.randn(2, 8, 16),))
    assert graph.trace_method == ("fx" if fx_traceable else "export")
    assert sum(n.fwd_flops for n in graph.nodes) == 2 * 2 * 8 * (16 * 16 + 16 * 4)
    assert type(model.scale) is torch.Tensor and not hasattr(model, "_tensor_constant0")


def test_a_long_error_is_cut_at_a_word_and_says_so():
    said = first_line(RuntimeError("word " * 100))
    assert said.endswith("word (...)") and len(said) < 250


class CpuMask(nn.Module):
    """A mask made without device= (LongT5's ``torch.ones(...)`` without an attention mask), on either side of +."""

    def __init__(self, mask_first: bool):
        super().__init__()
        self.fc, self.mask_first = nn.Linear(8, 8), mask_first

    def forward(self, x):
        if x.dtype == torch.float64:  # a branch torch.fx cannot take: the export's message is the one shown
            x = x.float()
        mask = torch.ones(x.shape[-1])
        return self.fc(mask + x if self.mask_first else x + mask)


@pytest.mark.parametrize("mask_first", [True, False])
def test_a_tensor_made_without_a_device_is_named_whichever_device_torch_names_first(mask_first):
    from autoplan.errors import TraceError

    with pytest.raises(TraceError, match="make it with device=x.device"):
        trace(CpuMask(mask_first), (torch.randn(2, 8),))


def test_a_build_that_needs_real_values_on_meta_is_told_what_autoplan_does(tmp_path):
    """torch's orthogonal parametrization calls .item() while it is built; under the meta device autoplan builds on."""
    from autoplan.errors import ModelFileError
    from autoplan.trace import trace_model_file

    (tmp_path / "ortho.py").write_text(
        "import torch\nfrom torch.nn.utils.parametrizations import orthogonal\n\n\n"
        "def build_model():\n    return orthogonal(torch.nn.Linear(8, 8))\n\n\n"
        "def example_inputs(batch_size):\n    return (torch.randn(batch_size, 8),)\n"
    )
    with pytest.raises(ModelFileError, match=r"builds the model on the meta device.*with torch.device\('cpu'\)"):
        trace_model_file(tmp_path / "ortho.py", 4)
