"""plan.compile in the executor (autoplan/execute/compiled.py): blocks compiled in place, FQNs
unchanged, and a compile failure as one sentence naming the block (numerics against eager:
tests/dist/test_execute.py's compile cases)."""

from __future__ import annotations

import pytest
import torch
import torch._inductor.config as inductor_config
import torch.nn as nn

from autoplan.errors import PlanError
from autoplan.execute.compiled import compile_blocks


class _Block(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.norm, self.fc = nn.LayerNorm(width), nn.Linear(width, width)

    def forward(self, x):
        return x + torch.nn.functional.gelu(self.fc(self.norm(x)))


class _Model(nn.Module):
    def __init__(self, width: int, layers: int = 2):
        super().__init__()
        self.blocks = nn.ModuleList(_Block(width) for _ in range(layers))
        self.head = nn.Linear(width, 1)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def test_a_compile_failure_is_one_sentence_naming_the_block():
    """A C++ compiler that is not there (a real inductor failure, no cached kernels to fall back on)."""
    model = _Model(11, layers=1)
    names = [n for n, _ in model.named_parameters()]
    assert compile_blocks(module=model, blocks=["blocks.0", "blocks.7"]) == 1  # blocks.7: another stage's
    assert [n for n, _ in model.named_parameters()] == names  # FQNs unchanged: tp_plan keys, FSDP, --verify
    with inductor_config.patch({"cpp.cxx": ("/nonexistent/c++",), "fx_graph_cache": False}):
        with torch._functorch.config.patch(enable_autograd_cache=False), pytest.raises(PlanError) as info:
            model(torch.randn(2, 11))
    text = str(info.value)
    assert "torch.compile failed on block 'blocks.0'" in text and "compile to false" in text
    assert "--fix compile=off" in text
