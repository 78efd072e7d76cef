"""Which trainable parameters no gradient reaches, found by one forward and loss before DDP wraps the model
(autoplan/execute/unreached.py): never read, read under torch.no_grad(), or read into an output the loss ignores;
and that forward leaves nothing behind."""

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


def test_the_forward_leaves_buffers_and_generators_as_they_were_and_judges_the_branch_it_took():
    norm = torch.nn.Sequential(torch.nn.BatchNorm1d(4), torch.nn.Dropout(0.5))
    x = torch.randn(3, 4)
    state = torch.get_rng_state()
    assert unreached_params(norm, (x,)) == []
    assert int(norm[0].num_batches_tracked) == 0 and torch.equal(norm[0].running_mean, torch.zeros(4))
    assert torch.equal(torch.get_rng_state(), state)  # the dropout's draw was on a forked generator

    class ValueBranch(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)

        def forward(self, x):
            return self.a(x) if x.sum() > 0 else self.b(x)  # DDP's search then looks every step

    assert unreached_params(ValueBranch(), (torch.ones(3, 4),)) == ["b.weight", "b.bias"]
    assert unreached_params(ValueBranch(), (torch.ones(3, 4), "extra")) == []  # a forward that fails: not judged
