"""A pipeline boundary's gradient side is priced at its own size (cost/blocks.py ``input_grad_bytes``): of the
tensors a stage receives, only those that require grad (the hidden state) get a gradient back, as torch's
``PipelineStage`` allocates gradient receive buffers and sends input gradients only for them (torch 2.13
stage.py ``_backward_metadata_inference``, ``_create_grad_recv_info``). A boolean mask made from the tokens and
rotary tables made from a buffer cross forward only, on a tiny model traced as the planner traces it."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
import torch.nn as nn
from synthetic import a100_profile

from autoplan.cost.model import CostModel
from autoplan.trace import trace
from autoplan.types.plan import Plan

BATCH, SEQ, DIM, BLOCKS = 4, 16, 32, 4


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(DIM, DIM)

    def forward(self, x, mask, rope):
        return x + self.proj(x * rope) * mask.unsqueeze(-1)


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(64, DIM)
        self.register_buffer("inv_freq", torch.rand(DIM))
        self.layers = nn.ModuleList(Block() for _ in range(BLOCKS))

    def forward(self, idx):
        x = self.emb(idx)
        mask = idx != 0  # bool, from the tokens alone: no gradient
        positions = torch.arange(SEQ, dtype=torch.float32, device=idx.device)
        rope = torch.cos(positions[:, None] * self.inv_freq)  # from a buffer: no gradient
        for layer in self.layers:
            x = layer(x, mask, rope)
        return x


@pytest.fixture(scope="module")
def model() -> CostModel:
    return CostModel(trace(Model(), (torch.randint(1, 64, (BATCH, SEQ)),)), a100_profile())


def _plan(schedule: str, virtual_stages: int) -> Plan:
    return Plan(devices=2, dp=1, tp=1, pp=2, micro_batch_size=1, num_microbatches=4, schedule=schedule,
                virtual_stages=virtual_stages, precision="fp32")  # fmt: skip


HIDDEN, MASK = SEQ * DIM * 4, SEQ * 1  # bytes per micro-batch of one sequence, fp32 and bool


def test_the_gradient_side_of_a_boundary_is_the_hidden_state_alone(model):
    """The stage receiving chunk 1 and 3 holds their inputs at hidden + mask + tables, and the gradients it sends
    back (and whose receive slots its sender holds) at the hidden state's bytes; the P2P messages agree."""
    plan = _plan("interleaved_1f1b", 2)
    stages, _, _ = model.priced_stages(plan)
    assert stages[1].boundary_grad_bytes == pytest.approx(HIDDEN)
    assert stages[1].boundary_bytes > HIDDEN + MASK  # and the tables
    for chunk in model.chunk_inputs(plan)[1:]:
        assert sum(chunk.returned) == pytest.approx(stages[1].boundary_grad_bytes)


@pytest.mark.parametrize("schedule, virtual_stages", [("interleaved_1f1b", 2), ("zbv", 2)])
def test_the_replayed_peak_holds_gradients_at_their_own_size(model, schedule, virtual_stages):
    """Each stage's peak holds its sent input gradients and gradient receive slots at the hidden state's bytes:
    priced at the whole boundary (as before) it is more by a whole number, at least m, of (mask + tables)."""
    plan = _plan(schedule, virtual_stages)
    stages, _, _ = model.priced_stages(plan)
    priced = [memory.peak_bytes for memory in model.stage_memory(plan, stages)]
    whole = [replace(stage, boundary_grad_bytes=stage.boundary_bytes) for stage in stages]
    before = [memory.peak_bytes for memory in model.stage_memory(plan, whole)]
    for stage, new, old in zip(stages, priced, before):
        extra = (old - new) / (stage.boundary_bytes - stage.boundary_grad_bytes)
        assert extra == pytest.approx(round(extra)) and round(extra) >= plan.num_microbatches, (extra, stage)
