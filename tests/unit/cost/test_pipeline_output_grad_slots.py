"""A stage's gradient receive slots hold its OUTPUT's gradient, its forward ones its input: torch's ``PipelineStage``
allocates forward receive buffers for what the previous stage sends (the first stage none) and gradient receive
buffers for the gradients the next stage sends back (the last stage none; torch 2.13 stage.py
``_create_grad_recv_info``, ``_setup_forward_recv_info``). On a tiny model whose blocks change width, so that every
boundary weighs its own, stage 0 of torch's 1F1B and GPipe holds m of stage 1's input gradients and the last stage
none; Megatron-Core's one send and one receive buffer on stage 0 are its output's (cost/pp/receive_slots.py)."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
from synthetic import a100_profile

from autoplan.cost.model import CostModel
from autoplan.trace import trace
from autoplan.types.plan import Plan

BATCH, SEQ, M = 4, 16, 4
WIDTHS = (8, 16, 32, 48, 64)  # block i maps WIDTHS[i] to WIDTHS[i + 1]: each boundary its own size


class Block(nn.Module):
    def __init__(self, width_in: int, width_out: int):
        super().__init__()
        self.proj = nn.Linear(width_in, width_out)

    def forward(self, x, mask):
        return torch.relu(self.proj(x)) * mask.unsqueeze(-1)


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(64, WIDTHS[0])
        self.layers = nn.ModuleList(Block(a, b) for a, b in zip(WIDTHS, WIDTHS[1:]))

    def forward(self, idx):
        x, mask = self.emb(idx), idx != 0  # the mask crosses every boundary forward only: no gradient
        for layer in self.layers:
            x = layer(x, mask)
        return x


@pytest.fixture(scope="module")
def model() -> CostModel:
    return CostModel(trace(Model(), (torch.randint(1, 64, (BATCH, SEQ)),)), a100_profile())


def _plan(pp: int, schedule: str, runtime: str = "autoplan") -> Plan:
    return Plan(devices=pp, dp=1, tp=1, pp=pp, micro_batch_size=1, num_microbatches=M, schedule=schedule,
                precision="fp32", runtime=runtime)  # fmt: skip


def _hidden_bytes(received) -> float:
    """The gradient bytes a boundary sends back: its hidden state's, one of the widths', fp32."""
    grads = sum(received.returned)
    assert grads in {SEQ * width * 4 for width in WIDTHS[1:]} and sum(received.sent) > grads  # the mask: forward only
    return grads


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
@pytest.mark.parametrize("pp", [2, 4])
def test_gradient_slots_hold_the_next_stages_input_gradients(model, pp, schedule):
    """Stage k holds m forward slots of its own input and m gradient slots of stage k + 1's input gradients: stage
    0's are m of stage 1's, the last stage's none; every boundary differs, so no other boundary could stand in."""
    plan = _plan(pp, schedule)
    stages, _, _ = model.priced_stages(plan)
    memory = model.stage_memory(plan, stages)
    received = model.chunk_inputs(plan)  # per stage, what it receives (stage 0: nothing)
    grads = [_hidden_bytes(received[k]) for k in range(1, pp)]
    assert len(set(grads)) == pp - 1  # unequal boundaries
    assert memory[0].buffers_bytes == pytest.approx(M * grads[0]) and grads[0] > 0
    for k in range(pp):
        forward = M * sum(received[k].sent) if k > 0 else 0.0
        output_grads = M * grads[k] if k < pp - 1 else 0.0
        assert memory[k].buffers_bytes == pytest.approx(forward + output_grads), k
        assert stages[k].output_grad_bytes == pytest.approx(output_grads / M), k
    assert stages[-1].output_grad_bytes == 0.0 and stages[-1].output_bytes == 0.0


@pytest.mark.parametrize("pp", [2, 4])
def test_megatrons_buffers_on_stage_0_are_its_outputs(model, pp):
    """Megatron-Core's one send and one receive buffer: stage 0 sends its output and receives its gradient (the
    whole tensor, as Megatron's p2p moves it), the last stage receives its input and sends its gradient."""
    plan = _plan(pp, "1f1b", runtime="megatron")
    stages, _, _ = model.priced_stages(plan)
    memory = model.stage_memory(plan, stages)
    received = model.chunk_inputs(plan)
    assert memory[0].buffers_bytes == pytest.approx(2 * sum(received[1].sent))
    assert memory[-1].buffers_bytes == pytest.approx(2 * sum(received[-1].sent))


@pytest.mark.parametrize("schedule", ["interleaved_1f1b", "zbv"])
def test_a_replayed_rank_weighs_its_outputs_and_their_gradients(model, schedule):
    """Where the replay prices a rank's states (cost/memory/replayed.py), its boundary tensors and gradients weigh
    at least those of every boundary its chunks receive or send on."""
    plan = Plan(devices=2, dp=1, tp=1, pp=2, micro_batch_size=1, num_microbatches=M, schedule=schedule,
                virtual_stages=2, precision="fp32")  # fmt: skip
    stages, _, _ = model.priced_stages(plan)
    received = model.chunk_inputs(plan)
    chunk_stage = [0, 1, 1, 0] if schedule == "zbv" else [0, 1, 0, 1]
    for chunk in range(1, 4):
        for stage in (chunk_stage[chunk], chunk_stage[chunk - 1]):  # its receiver and its sender
            tensors, grads = stages[stage].held_boundary_bytes
            assert tensors >= sum(received[chunk].sent) and grads >= sum(received[chunk].returned) > 0
