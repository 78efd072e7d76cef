"""The pipeline split hands the loss what the model returns (a dict, a tuple), not the flat
tensors torch.export leaves on the last stage. One process: splitting needs no process group."""

from __future__ import annotations

import copy
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
    """Statistics taken under torch.no_grad() in forward(), one in the model's own forward and one in a block's
    (a running mean updated in place): torch.export keeps each region as a submodule of its own, which torch's
    pipeline split (2.13) lost (execute/pipeline_regions.py)."""

    def __init__(self):
        super().__init__("tuple")
        self.register_buffer("running", torch.zeros(8))

    def forward(self, x):
        with torch.no_grad():
            scale = x.abs().mean()
        h = self.embed(x) / (scale + 1)
        for index, block in enumerate(self.blocks):
            if index == 1:
                with torch.no_grad():
                    self.running.mul_(0.5).add_(0.5 * h.mean(0))
                h = h - self.running
            h = torch.relu(block(h))
        return self.head(h)


class Stat(nn.Module):
    @torch.no_grad()
    def forward(self, x):
        return x.abs().mean()


class NoGradChild(TwoBlocks):
    """The region in a child module's forward (``@torch.no_grad()``), called before the blocks."""

    def __init__(self):
        super().__init__("tuple")
        self.stat = Stat()

    def forward(self, x):
        h = self.embed(x) / (self.stat(x) + 1)
        for block in self.blocks:
            h = torch.relu(block(h))
        return self.head(h)


@pytest.mark.parametrize("make", [NoGradRegion, NoGradChild])
def test_no_grad_regions_split_and_the_stages_compute_what_the_model_computes(make):
    torch.manual_seed(0)
    model, x = make(), torch.randn(2, 4)
    reference = copy.deepcopy(model)  # the stages hold the model's own parameters and buffers
    pipe, _ = split_model(model=model, plan=StagesOnly([["blocks.0"], ["blocks.1"]]), microbatch_args=(x,))
    model.load_state_dict(reference.state_dict())  # both start alike, whatever the export ran
    got, want = _run_stages(pipe, x), reference(x)
    got.sum().backward()
    want.sum().backward()
    torch.testing.assert_close(got, want)
    held = {name: p for i in range(2) for name, p in pipe.get_stage_module(i).named_parameters()}
    assert set(held) == {name for name, _ in reference.named_parameters()}
    for name, p in reference.named_parameters():
        torch.testing.assert_close(held[name].grad, p.grad)
    for name, buffer in reference.named_buffers():  # updated in place by the stages, as by the model
        torch.testing.assert_close(model.get_buffer(name), buffer)
    assert any(b.abs().sum() > 0 for b in reference.buffers()) or not list(reference.buffers())


class Heads(nn.Module):
    """SegFormer's shape: two encoder blocks, then one projection of each encoder block's output. In four chunks the
    split graph calls stage 2 (reading stage 0's output) before stage 1, which it does not depend on."""

    def __init__(self):
        super().__init__()
        self.enc = nn.ModuleList(nn.Linear(8, 8) for _ in range(2))
        self.proj = nn.ModuleList(nn.Linear(8, 8) for _ in range(2))

    def forward(self, x):
        feats = []
        for block in self.enc:
            x = torch.relu(block(x))
            feats.append(x)
        return sum(proj(f) for f, proj in zip(feats, self.proj))


def test_stages_the_split_graph_calls_out_of_order_carry_what_each_later_stage_reads():
    torch.manual_seed(0)
    model, x = Heads(), torch.randn(2, 8)
    chunks = [["enc.0"], ["enc.1"], ["proj.0"], ["proj.1"]]
    pipe, _ = split_model(model=model, plan=StagesOnly(chunks, pp=2, virtual_stages=2), microbatch_args=(x,))
    calls = [n.target for n in pipe.split_gm.graph.nodes if n.op == "call_module"]
    assert calls != sorted(calls)  # what the case is for: graph order is not stage order
    out = (x,)
    for index in range(4):  # the order the schedule runs them in, each fed what the one before returned
        out = pipe.get_stage_module(index)(*out)
        out = out if isinstance(out, tuple) else (out,)
    torch.testing.assert_close(out[0], model(x))
