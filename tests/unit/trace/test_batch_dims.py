"""The batch on dim 0 of every input of a model file (autoplan/trace/batch_dims.py): a sequence-first model, a
hidden state carried as (layers, batch, hidden) and flattened rows are refused in one sentence; autoplan would
split them along their sequence, or not at all, and train on other gradients."""

from __future__ import annotations

import textwrap

import pytest

from autoplan.cli import main

MODEL = """
import torch
import torch.nn as nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(20, 8)
        self.rnn = nn.GRU(8, 8, num_layers=2, batch_first={batch_first})
        self.out = nn.Linear(8, 20)

    def forward(self, ids, h0=None):
        y, _ = self.rnn(self.embed(ids), h0)
        return self.out(y)


def build_model():
    return Net()


def example_inputs(batch_size):
    return {inputs}
"""
CASES = {
    "sequence first": ("False", "(torch.zeros(6, batch_size, dtype=torch.long),)", "holds the batch of 8 on dim 1"),
    "hidden state": (
        "True",
        "(torch.zeros(batch_size, 6, dtype=torch.long), torch.zeros(2, batch_size, 8))",
        "tensor 1 (shape [2, 8, 8]) holds the batch of 8 on dim 1",
    ),
    "flattened": ("True", "(torch.zeros(batch_size * 6, dtype=torch.long).view(-1, 1),)", "grows with the batch"),
    "pairwise": (
        "True",
        "(torch.zeros(batch_size, 6, dtype=torch.long), torch.zeros(batch_size, batch_size))",
        "grows with the batch on dims [0, 1], not on dim 0 alone",
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_an_input_with_its_batch_elsewhere_than_dim_0_is_one_sentence(tmp_path, capsys, case):
    batch_first, inputs, said = CASES[case]
    path = tmp_path / "model.py"
    path.write_text(textwrap.dedent(MODEL.format(batch_first=batch_first, inputs=inputs)))
    args = ["plan", str(path), "--devices", "2", "--profile", "cpu-gloo", "--batch", "8", "--out", str(tmp_path / "p")]
    assert main(args) != 0
    err = capsys.readouterr().err
    assert said in err and "batch_first=True" in err and "Traceback" not in err


def test_a_batch_first_model_plans(tmp_path):
    path = tmp_path / "model.py"
    path.write_text(MODEL.format(batch_first="True", inputs="(torch.zeros(batch_size, 6, dtype=torch.long),)"))
    out = tmp_path / "p"
    assert main(["plan", str(path), "--devices", "2", "--profile", "cpu-gloo", "--batch", "8", "--out", str(out)]) == 0
    assert (out / "plan.json").exists()
