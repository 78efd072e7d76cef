"""Which trainable parameters no gradient reaches, found on fake tensors before DDP wraps the model
(autoplan/execute/unreached.py): never read, read under torch.no_grad(), or read into an output the loss ignores."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from autoplan.execute.unreached import unreached_params

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "odd_models"))
import no_grad_stem  # noqa: E402


def test_parameters_no_gradient_reaches_from_the_loss_or_else_the_outputs():
    model = no_grad_stem.build_model()
    inputs, target = no_grad_stem.example_inputs(2), no_grad_stem.example_target(2)
    from_loss = unreached_params(model, inputs, loss_fn=no_grad_stem.loss_fn, target=target)
    assert from_loss == ["embed.weight", "spare.weight", "spare.bias", "pool.weight", "pool.bias"]
    assert unreached_params(model, inputs) == ["embed.weight", "spare.weight", "spare.bias"]  # pooled is an output
    assert unreached_params(model, None) == []  # nothing to run: not judged


def test_the_model_is_left_as_it_was_and_a_forward_fake_tensors_cannot_run_is_not_judged():
    norm = torch.nn.BatchNorm1d(4)
    assert unreached_params(norm, (torch.randn(3, 4),)) == []
    assert int(norm.num_batches_tracked) == 0 and torch.equal(norm.running_mean, torch.zeros(4))

    class ValueBranch(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)

        def forward(self, x):
            return self.a(x) if x.sum() > 0 else self.b(x)  # a branch on a value: fake tensors cannot take it

    assert unreached_params(ValueBranch(), (torch.randn(3, 4),)) == []
