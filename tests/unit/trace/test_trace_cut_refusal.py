"""Failing fast on a model no tracer can follow (autoplan/trace/cut_watch.py): when the export of the
model cut to its first blocks fails where the whole model would fail too, the model is refused after
that one export; when the cut itself may be the cause, the whole model is exported as before."""

from __future__ import annotations

import pytest
import torch

from autoplan.cli import main
from autoplan.errors import TraceError
from autoplan.trace import trace

LATE_HOST_CALL = """
import torch


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(32, 32) for _ in range(8))

    def forward(self, x):
        for layer in self.layers:
            x = torch.relu(layer(x))
        scale = float(x[0, 0].detach().numpy())
        return x * scale


def build_model():
    return Net()


def example_inputs(batch_size):
    return (torch.randn(batch_size, 32),)
"""


@pytest.fixture
def exports(monkeypatch):
    """The torch.export calls made, counted."""
    real, made = torch.export.export, []
    monkeypatch.setattr(torch.export, "export", lambda *a, **k: made.append(1) or real(*a, **k))
    return made


def test_a_host_call_after_the_blocks_is_refused_after_the_cut_export(tmp_path, capsys, exports):
    path = tmp_path / "late_host_call.py"
    path.write_text(LATE_HOST_CALL)
    assert main(["trace", str(path), "--batch", "4", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    line = LATE_HOST_CALL.splitlines().index("        scale = float(x[0, 0].detach().numpy())") + 1
    assert f"late_host_call.py:{line}" in err and ".numpy() is not supported" in err
    assert "the model cut to its first 3 of 8 blocks 'layers'" in err
    assert len(exports) == 1  # the cut export only: the whole model was not exported


class _Residual(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(32, 32)

    def forward(self, x):
        return x + self.fc(x)


class _FailingBlock(_Residual):
    def forward(self, x):
        return self.fc(x) * float(x.sum().detach().numpy())  # a host call no tracer follows


class _Halving(torch.nn.Module):
    def forward(self, x):
        return x[..., : x.shape[-1] // 2]


class _Stack(torch.nn.Module):
    def __init__(self, block, n=8):
        super().__init__()
        self.blocks = torch.nn.ModuleList(block() for _ in range(n))

    def forward(self, x):
        if x.dim() == 2:  # torch.fx cannot branch on a traced value; torch.export can
            for block in self.blocks:
                x = block(x)
        return x


class _CountingStack(_Stack):
    """Looks at its own depth: the cut model fails where the whole one does not."""

    def forward(self, x):
        if len(self.blocks) != 8:
            raise ValueError("expected 8 blocks")
        return super().forward(x)


class _HalvingStack(_Stack):
    """Blocks that halve the width: after the cut the head sees another width than after all eight."""

    def __init__(self):
        super().__init__(_Halving)
        self.head = torch.nn.Linear(1, 4)

    def forward(self, x):
        return self.head(super().forward(x))


def test_a_block_that_fails_is_refused_after_the_cut_export(exports):
    with pytest.raises(TraceError, match="cut to its first 3 of 8 blocks") as failure:
        trace(_Stack(_FailingBlock), (torch.randn(4, 32),))
    assert "in module 'blocks.0" in str(failure.value) and len(exports) == 1


@pytest.mark.parametrize(
    ("build", "width"), [(lambda: _CountingStack(_Residual), 32), (_HalvingStack, 256)], ids=["counts", "halves"]
)
def test_a_failure_the_cut_may_cause_exports_the_whole_model(build, width, exports):
    graph = trace(build(), (torch.randn(4, width),))
    assert graph.trace_method == "export" and len(exports) == 2


def test_a_loop_over_range_that_indexes_the_cut_experts_exports_the_whole_model(monkeypatch, exports):
    """tests/odd_models/loop_moe.py indexes its experts' ModuleList by ``range(num_experts)``: cut to 3 of 16
    it raises IndexError inside the container, which the whole model never does, so the whole is exported."""
    from pathlib import Path

    from autoplan.trace import trace_model_file

    for name, value in dict(EXPERTS=16, TOP_K=1, SEQ=4).items():
        monkeypatch.setenv(f"AUTOPLAN_LOOP_MOE_{name}", str(value))
    graph = trace_model_file(Path(__file__).resolve().parents[2] / "odd_models" / "loop_moe.py", 8)
    assert graph.trace_method == "export" and len(exports) == 2
