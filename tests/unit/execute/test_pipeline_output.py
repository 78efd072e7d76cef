"""The pipeline split hands the loss what the model returns (a dict, a tuple), not the flat
tensors torch.export leaves on the last stage. One process: splitting needs no process group."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn as nn
import torch.utils._pytree as pytree

from autoplan.execute.pipeline import split_model


class TwoBlocks(nn.Module):
    def __init__(self, returns: str):
        super().__init__()
        self.returns = returns
        self.embed = nn.Linear(4, 8)
        self.blocks = nn.ModuleList([nn.Linear(8, 8), nn.Linear(8, 8)])
        self.head = nn.Linear(8, 3)

    def forward(self, x):
        h = self.embed(x)
        early = h * 2
        for block in self.blocks:
            h = torch.relu(block(h))
        logits = self.head(h)
        if self.returns == "dict":
            return {"logits": logits, "aux": h.mean()}
        if self.returns == "tuple":
            return logits, h
        return logits, early  # `early` is made on stage 0


@dataclasses.dataclass
class StagesOnly:
    stages: list
    pp: int = 2
    virtual_stages: int = 1


def _run_stages(pipe, x):
    out = pipe.get_stage_module(0)(x)
    return pipe.get_stage_module(1)(*(out if isinstance(out, tuple) else (out,)))


@pytest.mark.parametrize("returns", ["dict", "tuple", "early"])  # early: an output made on stage 0 is carried
def test_last_stage_output_rebuilds_into_what_the_model_returns(returns):
    torch.manual_seed(0)
    model, x = TwoBlocks(returns), torch.randn(2, 4)
    pipe, out_spec = split_model(model=model, plan=StagesOnly([["blocks.0"], ["blocks.1"]]), microbatch_args=(x,))
    out = _run_stages(pipe, x)
    rebuilt = out_spec.rebuild(list(out) if isinstance(out, (tuple, list)) else [out])
    expected = model(x)
    assert type(rebuilt) is type(expected)
    for got, want in zip(pytree.tree_leaves(rebuilt), pytree.tree_leaves(expected)):
        torch.testing.assert_close(got, want)


class NoGradRegion(TwoBlocks):
    """A statistic taken under torch.no_grad() in forward(): torch.export keeps the region as a submodule of its
    own, which torch's pipeline split (2.13) then fails to place."""

    def forward(self, x):
        with torch.no_grad():
            scale = x.abs().mean()
        h = self.embed(x) / (scale + 1)
        for block in self.blocks:
            h = torch.relu(block(h))
        return self.head(h)


def test_a_split_that_fails_on_a_no_grad_region_says_so():
    from autoplan.errors import PlanError

    with pytest.raises(PlanError, match=r"forward\(\) runs code under torch.no_grad\(\).*plan pp=1"):
        split_model(
            model=NoGradRegion("tuple"),
            plan=StagesOnly([["blocks.0"], ["blocks.1"]]),
            microbatch_args=(torch.randn(2, 4),),
        )
