"""The pipeline partition's room for a stage (cost/pp/partition.py ``stage_capacity_bytes``) sets aside the
boundary tensors the price holds as buffers: one send and one receive buffer where the runtime runs its own
pipeline, torch's receive slots (cost/pp/receive_slots.py) where torch's ``PipelineStage`` runs it. The room
stands for every stage, so it sets aside no more than any stage's price holds at its peak: single-chunk stages'
slots (cost/memory/plan.py) and, where the price replays the order (cost/memory/replayed.py), the boundary
tensors of every state of the rank's replay that may be its peak, a boundary's gradients weighing D_g <= D (no
gradient comes back for a mask or rotary table)."""

from __future__ import annotations

import pytest
from synthetic import synthetic_profile

from autoplan.cost.memory.per_device import usable_bytes
from autoplan.cost.memory.replayed import replays_memory
from autoplan.cost.pp.partition import receive_buffers, stage_capacity_bytes
from autoplan.cost.pp.rank_memory import rank_states
from autoplan.cost.pp.receive_slots import held_bytes, single_chunk_slots
from autoplan.types.plan import Plan

SCHEDULES = [("gpipe", 1), ("1f1b", 1), ("interleaved_1f1b", 2), ("interleaved_zb", 1), ("interleaved_zb", 2),
             ("zbv", 2), ("dualpipev", 2)]  # fmt: skip


def _plan(schedule: str, v: int, pp: int, m: int, runtime: str = "autoplan") -> Plan:
    return Plan(
        devices=pp, dp=1, tp=1, pp=pp, micro_batch_size=1, num_microbatches=m, schedule=schedule, virtual_stages=v,
        runtime=runtime,
    )  # fmt: skip


def _priced(plan: Plan, rank: int, boundary: float, grads: float) -> float:
    """The fewest bytes of boundary tensors (``boundary`` each) and their gradients (``grads``) ``rank``'s price
    may hold at its peak (module docstring)."""
    tensors = dict(boundary_bytes=boundary, grad_bytes=grads)
    if not replays_memory(plan):
        return held_bytes(*single_chunk_slots(pp=plan.pp, m=plan.num_microbatches, rank=rank), **tensors)
    key = dict(schedule=plan.schedule, pp=plan.pp, virtual_stages=plan.virtual_stages, m=plan.num_microbatches)
    return min(
        held_bytes(*state[-3:-1], **tensors) for state in rank_states(rank=rank, **key)
    )  # (..., sent, grads, loss)


@pytest.mark.parametrize("schedule, v", SCHEDULES)
@pytest.mark.parametrize("pp, m", [(2, 4), (4, 8), (4, 16)])
@pytest.mark.parametrize("grads", [3.0e6, 2.0e6, 0.0])  # every tensor has a gradient, some do (a mask), none does
def test_the_room_sets_aside_no_more_receive_slots_than_any_stages_price_holds(schedule, v, pp, m, grads):
    plan, boundary = _plan(schedule, v, pp, m), 3.0e6
    count = receive_buffers(plan)
    held = held_bytes(*count, boundary_bytes=boundary, grad_bytes=grads)
    priced = [_priced(plan, rank, boundary, grads) for rank in range(pp)]
    assert held >= m * grads and held <= min(priced), (held, priced)
    if not replays_memory(plan):  # 1F1B and GPipe: the first stage's m gradient slots exactly
        assert count == (0, m) and held == min(priced) == m * grads
    profile = synthetic_profile()
    room = stage_capacity_bytes(profile, plan, boundary_bytes=boundary, grad_bytes=grads, block_params=1e6)
    assert usable_bytes(profile.device.memory_bytes) - room == pytest.approx(held)


def test_a_runtime_with_its_own_pipeline_keeps_one_send_and_one_receive_buffer():
    assert receive_buffers(_plan("1f1b", 1, 4, 8, runtime="megatron")) == (2, 0)
    assert receive_buffers(_plan("1f1b", 1, 1, 8)) == (0, 0)
