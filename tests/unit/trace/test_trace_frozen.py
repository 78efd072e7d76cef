"""The trace records which parameters train (requires_grad) and measures the backward that runs:
a frozen linear computes its input's gradient only, and none where nothing before it trains."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn as nn

from autoplan.cli import main
from autoplan.trace import trace
from autoplan.types.graph import Graph

DIM, RANK, TOKENS = 32, 4, 8


class Adapted(nn.Module):
    """A frozen linear with a trainable low-rank adapter (LoRA's shape)."""

    def __init__(self):
        super().__init__()
        self.base = nn.Linear(DIM, DIM, bias=False).requires_grad_(False)
        self.down, self.up = nn.Linear(DIM, RANK, bias=False), nn.Linear(RANK, DIM, bias=False)

    def forward(self, x):
        return torch.relu(self.base(x) + self.up(self.down(x)))


class Model(nn.Module):
    def __init__(self, blocks: int = 3):
        super().__init__()
        self.blocks = nn.ModuleList([Adapted() for _ in range(blocks)])

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return x


@pytest.fixture(scope="module")
def graph() -> Graph:
    return trace(Model(), (torch.randn(TOKENS, DIM),))


def test_the_graph_records_which_parameters_train(graph):
    frozen = {name for name, info in graph.parameters.items() if not info.trainable}
    assert frozen == {f"blocks.{i}.base.weight" for i in range(3)}
    assert graph.trainable_param_count == 3 * 2 * DIM * RANK
    again = Graph.from_dict(json.loads(json.dumps(graph.to_dict())))
    assert again.frozen_params == graph.frozen_params and again.to_dict() == graph.to_dict()


def test_a_graph_that_trains_everything_serialises_without_the_flag():
    model = Model()
    model.requires_grad_(True)
    data = trace(model, (torch.randn(TOKENS, DIM),)).to_dict()
    assert all(set(info) == {"shape", "dtype", "numel", "bytes"} for info in data["parameters"].values())


def test_a_frozen_linear_computes_only_its_input_gradient(graph):
    bases = [n for n in graph.nodes if n.op == "linear" and n.param_names[0].endswith("base.weight")]
    first, *later = bases
    assert first.bwd_flops == 0 and first.name not in graph.grad_nodes()  # nothing before it trains
    assert all(n.bwd_flops == n.fwd_flops == 2 * TOKENS * DIM * DIM for n in later)  # dX only, not dW


def test_blocks_whose_backward_differs_are_priced_apart(graph):
    assert [g.layers for g in graph.groups] == [["blocks.0"], ["blocks.1", "blocks.2"]]
    assert graph.groups[1].signature == graph.groups[0].signature + "-bwd1"


def test_the_trace_command_counts_the_trainable_parameters(tmp_path, capsys):
    model_file = tmp_path / "adapted.py"
    model_file.write_text(
        "import sys\n"
        f"sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
        "import torch\n"
        "from test_trace_frozen import DIM, TOKENS, Model\n\n"
        "def build_model():\n    return Model()\n\n"
        "def example_inputs(batch_size):\n    return (torch.randn(batch_size, DIM),)\n"
    )
    assert main(["trace", str(model_file), "--batch", "2", "--out", str(tmp_path / "t"), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["trainable_parameters"] == 3 * 2 * DIM * RANK < summary["parameters"]
