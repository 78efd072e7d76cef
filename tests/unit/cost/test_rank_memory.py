"""The pipeline memory torch's runtime holds (docs/cost-model.md, "Pipeline memory"): the interleaved schedules'
orders against torch's own ``pipeline_order``, each chunk weighed by its own bytes, the sends held to the step's
end where torch's ``_PipelineScheduleRuntime`` runs the schedule (and not where Megatron-Core runs it), torch's
receive buffers, and the loss's gradients only in the loss's backward."""

from __future__ import annotations

import dataclasses
import types

import pytest
import torch
from synthetic import a100_profile, gpt_graph
from torch.distributed.pipelining import schedules as torch_schedules
from torch.distributed.pipelining.schedules import _ComputationType as Op

from autoplan.cost import CostModel
from autoplan.cost.memory.replayed import held_floor, replayed_held
from autoplan.cost.pp.looped_orders import looped_order
from autoplan.cost.pp.rank_memory import frontier, rank_states
from autoplan.types import Plan
from autoplan.types.layout import chunks_of_stage

KIND = {Op.FORWARD: "F", Op.BACKWARD_INPUT: "B", Op.BACKWARD_WEIGHT: "W", Op.FULL_BACKWARD: "BW"}
CLASSES = {
    "interleaved_1f1b": torch_schedules.ScheduleInterleaved1F1B,
    "interleaved_zb": torch_schedules.ScheduleInterleavedZeroBubble,
}


def _torch_order(schedule: str, *, pp: int, v: int, m: int) -> tuple:
    """Each rank's actions as torch's class builds them, without a process group."""
    order = []
    for rank in range(pp):
        stages = [
            types.SimpleNamespace(
                num_stages=v * pp, group_size=pp, group_rank=rank, submod=torch.nn.Linear(1, 1), stage_index=s
            )  # fmt: skip
            for s in chunks_of_stage(rank, pp=pp, virtual_stages=v)
        ]
        actions = CLASSES[schedule](stages, m).pipeline_order[rank]
        order.append(tuple((KIND[a.computation_type], a.stage_index, a.microbatch_index) for a in actions if a))
    return tuple(order)


@pytest.mark.parametrize("schedule", ["interleaved_1f1b", "interleaved_zb"])
@pytest.mark.parametrize("pp", [2, 3, 4, 6])
def test_each_ranks_interleaved_order_is_torchs(schedule, pp):
    for v in (1, 2, 3) if schedule == "interleaved_zb" else (2, 3):
        for m in (pp, pp + 1, 2 * pp, 3 * pp, 5 * pp):
            if m % max(1, m // pp) == 0:
                assert looped_order(schedule, pp=pp, virtual_stages=v, m=m) == _torch_order(schedule, pp=pp, v=v, m=m)


@pytest.mark.parametrize("schedule,v", [("interleaved_1f1b", 2), ("interleaved_zb", 2), ("zbv", 2)])
def test_at_the_steps_end_every_tensor_handed_on_is_still_held(schedule, v):
    """Once every backward ran, the most boundary tensors a rank holds: each of its chunks still holds its m
    forward receive slots (all but chunk 0) and m gradient slots (all but the loss's chunk), and the
    m outputs and m input gradients it sent to another rank (at the V's turn, the neighbour's slots)."""
    pp, m = 4, 8
    for rank in range(pp):
        chunks = chunks_of_stage(rank, pp=pp, virtual_stages=v, v_shape=schedule == "zbv")
        away = [c for c in range(pp * v) if c not in chunks]
        handed = sum(m * ((c > 0) * (1 + (c - 1 in away)) + (c < pp * v - 1) * (1 + (c + 1 in away))) for c in chunks)
        states = rank_states(schedule=schedule, pp=pp, virtual_stages=v, m=m, rank=rank)
        assert max(state[2 * v] + state[2 * v + 1] for state in states) == handed


def test_the_frontier_keeps_exactly_the_states_none_exceeds():
    states = [(1, 2, 0), (2, 1, 0), (1, 1, 0), (2, 2, 0), (0, 0, 5), (2, 2, 0)]
    assert frontier(states) == ((0, 0, 5), (2, 2, 0))


@pytest.fixture(scope="module")
def model() -> CostModel:
    return CostModel(gpt_graph(layers=8, hidden=512, heads=8, seq_len=256, vocab=2048, batch_size=16), a100_profile())


def _plan(schedule: str, **kw) -> Plan:
    fields = dict(devices=4, dp=1, tp=1, pp=4, micro_batch_size=1, num_microbatches=8, precision="bf16")
    return Plan(**{**fields, "schedule": schedule, "virtual_stages": 2, **kw})


@pytest.mark.parametrize("schedule", ["interleaved_1f1b", "zbv"])
def test_each_chunk_of_a_stage_carries_its_own_activations(model, schedule):
    plan = _plan(schedule)
    stages, _, _ = model.priced_stages(plan)
    for index, stage in enumerate(stages):
        assert sorted(stage.chunk_saved_bytes) == sorted(chunks_of_stage(index, pp=4, virtual_stages=2,
                                                                         v_shape=schedule == "zbv"))  # fmt: skip
        assert sum(stage.chunk_saved_bytes.values()) == pytest.approx(stage.saved_bytes)
        assert sum(stage.chunk_held_bytes.values()) == pytest.approx(stage.wgrad_held_bytes)
    first, last = (0, 7) if schedule == "zbv" else (0, 4)
    assert stages[0].chunk_saved_bytes[last] != stages[0].chunk_saved_bytes[first]  # the head and loss beside h.7


def test_a_v_stage_0_weighs_its_two_chunks_apart(model):
    """ZBV's stage 0 runs the embedding's chunk (0) and the head's (7): it peaks inside the loss's backward
    holding 7 micro-batches of chunk 0 and 1 of chunk 7, priced 7 S_0 + S_7 with the loss's gradients, below
    the even share, 4 (S_0 + S_7), of the 8 chunks it holds (the audit's -10% before)."""
    plan = _plan("zbv")
    stages, _, _ = model.priced_stages(plan)
    stage = stages[0]
    held, pending, _sent, loss = replayed_held(plan, 0, stage)
    first, last = stage.chunk_saved_bytes[0], stage.chunk_saved_bytes[7]
    assert held * stage.saved_bytes == pytest.approx(7 * first + last)
    assert held * stage.saved_bytes < 4 * stage.saved_bytes and first < last
    assert (pending, loss) == (0.0, stage.loss_grad_bytes)


def test_torchs_interleaved_runtime_holds_its_sends_where_megatrons_does_not(model):
    """The same interleaved plan on autoplan's runtime (torch's ScheduleInterleaved1F1B, sends waited at the
    step's end) and on Megatron-Core's (each send waited at once): a middle stage holds more under torch."""
    torch_plan, megatron_plan = _plan("interleaved_1f1b"), _plan("interleaved_1f1b", runtime="megatron")
    stages, _, _ = model.priced_stages(torch_plan)
    _held, _pending, sent, _loss = replayed_held(torch_plan, 1, stages[1])
    assert sent > 0
    torch_peak = model.stage_memory(torch_plan, stages)[1].peak_bytes
    megatron_stages, _, _ = model.priced_stages(megatron_plan)
    assert torch_peak > model.stage_memory(megatron_plan, megatron_stages)[1].peak_bytes


def test_the_loss_gradients_count_only_in_the_losss_backward(model):
    """The last stage's peak state counts the loss's gradients only if it is a state inside the last chunk's
    backward; the states after each action never do."""
    plan = _plan("interleaved_zb")
    states = rank_states(schedule="interleaved_zb", pp=4, virtual_stages=2, m=8, rank=3)
    assert {s[-1] for s in states} == {0, 1}
    assert all(s[-1] == 0 for s in rank_states(schedule="interleaved_zb", pp=4, virtual_stages=2, m=8, rank=1))
    stages, _, _ = model.priced_stages(plan)
    *_, loss = replayed_held(plan, 3, stages[3])
    assert loss in (0.0, stages[3].loss_grad_bytes)


@pytest.mark.parametrize("schedule", ["interleaved_1f1b", "interleaved_zb"])
def test_the_memory_floor_counts_stay_below_every_chunk_split(model, schedule):
    """held_floor's counts times the whole stage's bytes never exceed the priced activations and kept gradients,
    however the stage's bytes split between its chunks."""
    plan = _plan(schedule)
    stages, _, _ = model.priced_stages(plan)
    for index, stage in enumerate(stages):
        held, pending = held_floor(plan, index)
        for share in (0.0, 0.1, 0.5, 0.9, 1.0):
            split = dict(
                zip(sorted(stage.chunk_saved_bytes), (share * stage.saved_bytes, (1 - share) * stage.saved_bytes))
            )
            kept = dict(
                zip(
                    sorted(stage.chunk_held_bytes),
                    (share * stage.wgrad_held_bytes, (1 - share) * stage.wgrad_held_bytes),
                )
            )
            skewed = type(stage)(**{**vars(stage), "chunk_saved_bytes": split, "chunk_held_bytes": kept})
            priced_held, priced_pending, _sent, _loss = replayed_held(plan, index, skewed)
            assert held <= priced_held + 1e-9
            assert held * stage.saved_bytes + pending * stage.wgrad_held_bytes <= (
                priced_held * stage.saved_bytes + priced_pending * stage.wgrad_held_bytes + 1e-6
            )


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
def test_torchs_single_chunk_stages_hold_a_receive_slot_per_micro_batch(model, schedule):
    """Under torch's Schedule1F1B and ScheduleGPipe every stage keeps, for the whole run, m forward receive
    buffers for its input (not stage 0) and m gradient ones for its output's gradient, the next stage's input
    gradient (not the last stage): they are its pipeline buffers, where Megatron-Core's schedule holds one send and
    one receive buffer, of its output on stage 0 and of its input on the last (cost/pp/receive_slots.py)."""
    plan = _plan(schedule, virtual_stages=1)
    stages, _, _ = model.priced_stages(plan)
    memory = model.stage_memory(plan, stages)
    m, pp = plan.num_microbatches, plan.pp
    for index, (stage, held) in enumerate(zip(stages, memory)):
        output_grads = stages[index + 1].boundary_grad_bytes if index < pp - 1 else 0.0
        slots = m * (index > 0) * stage.boundary_bytes + m * output_grads
        assert held.buffers_bytes == pytest.approx(slots), index
    assert memory[0].buffers_bytes > 0 < stages[1].boundary_grad_bytes
    megatron = _plan(schedule, virtual_stages=1, runtime="megatron")
    megatron_stages, _, _ = model.priced_stages(megatron)
    for index, held in enumerate(model.stage_memory(megatron, megatron_stages)):
        received = megatron_stages[max(index, 1)].boundary_bytes  # stage 0 sends stage 1's input, gets its gradient
        assert held.buffers_bytes == pytest.approx(2 * received) and received > 0, index


def test_the_losss_saved_tensors_leave_at_its_b(model):
    """torch's split backward frees the loss's saved tensors (cross-entropy's log-softmax output) at the last
    chunk's B, not its W: the loss's stage, at a peak that keeps the last chunk's gradients from B to W, is
    priced below the same stage holding them to W (the pp = 4 audit's -6.9% on interleaved_zb's last stage)."""
    plan = _plan("interleaved_zb")
    stages, _, _ = model.priced_stages(plan)
    last = stages[-1]
    assert last.loss_saved_bytes > 0 and not any(s.loss_saved_bytes for s in stages[:-1])
    _held, pending, _sent, _loss = replayed_held(plan, plan.pp - 1, last)
    _held, pending_to_w, _sent, _loss = replayed_held(plan, plan.pp - 1, dataclasses.replace(last, loss_saved_bytes=0))
    assert pending < pending_to_w
