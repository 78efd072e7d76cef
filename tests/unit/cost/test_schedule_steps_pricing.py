"""Plan.schedule_steps priced (cost/model.py, cost/dp/messages.py): k schedule steps of m / k micro-batches per
optimizer step fill and drain the pipeline k times, hold one step's receive buffers and in-flight activations,
and send the once-a-schedule-step dp messages (FSDP2's reduce-scatter, ZeRO-3's first-forward gather) k times;
the micro-batches' own work is the same m of them."""

from __future__ import annotations

from dataclasses import replace

import pytest
from synthetic import gpt_graph, synthetic_profile

from autoplan.cost.dp.messages import FORWARD, GRADS, WEIGHTS, dp_messages, find
from autoplan.cost.memory.alone import memory_alone
from autoplan.cost.model import CostModel
from autoplan.cost.network.mesh import plan_mesh_groups
from autoplan.cost.pp.messages import pipeline_sends_s
from autoplan.types.plan import Plan


@pytest.fixture(scope="module")
def model() -> CostModel:
    return CostModel(gpt_graph(layers=8, hidden=256, batch_size=8), synthetic_profile())


def _plan(**changes) -> Plan:
    fields = dict(dp=2, tp=1, pp=2, micro_batch_size=1, num_microbatches=8, precision="bf16", schedule_steps=2)
    fields.update(changes)
    return Plan(devices=fields["dp"] * fields["tp"] * fields["pp"], **fields)


@pytest.mark.parametrize(
    "changes",
    [dict(), dict(schedule="interleaved_1f1b", virtual_stages=2), dict(schedule="zbv", virtual_stages=2, pp=2),
     dict(zero_stage=1), dict(schedule="interleaved_zb", recompute="full"), dict(runtime="torchtitan")],
)  # fmt: skip
def test_the_schedule_runs_k_times_at_m_over_k(model, changes):
    plan = _plan(**changes)
    whole, per_step = replace(plan, schedule_steps=1), replace(plan, num_microbatches=4, schedule_steps=1)
    cost, one, step = model.estimate(plan), model.estimate(whole), model.estimate(per_step)
    assert cost.bubble_s == pytest.approx(2 * step.bubble_s) and cost.bubble_s > one.bubble_s
    groups = plan_mesh_groups(model.profile, plan)
    sends = pipeline_sends_s(
        model.profile, per_step, model.chunk_inputs(plan), group=groups["pp"], tp_group=groups["tp"]
    )
    assert cost.pp_comm_s - step.pp_comm_s == pytest.approx(sends)  # (v m / k + p - 1) slots k times, tied sync once
    assert cost.compute_s == pytest.approx(one.compute_s) and cost.recompute_s == pytest.approx(one.recompute_s)
    assert cost.peak_memory_bytes == step.peak_memory_bytes  # one schedule step's buffers and activations
    assert memory_alone(model, plan).peak_memory_bytes == cost.peak_memory_bytes
    assert cost.step_time_s > one.step_time_s


def test_torch_receive_buffers_shrink_to_one_schedule_steps(model):
    plan = _plan(pp=4, num_microbatches=32, schedule_steps=4)  # stage 0 holds 4 in flight: the others' slots show
    assert model.estimate(plan).peak_memory_bytes < model.estimate(replace(plan, schedule_steps=1)).peak_memory_bytes


@pytest.mark.parametrize("zero, scattered, gathered", [(0, 1, None), (1, 1, None), (2, 4, None), (3, 4, 4)])
def test_fsdp_syncs_once_per_schedule_step(model, zero, scattered, gathered):
    plan = _plan(num_microbatches=16, schedule_steps=4, zero_stage=zero)
    messages = dp_messages(plan)
    assert find(messages, GRADS).times_per_step(16) == scattered
    gather = find(messages, WEIGHTS, FORWARD)
    assert (gather.times_per_step(16) if gather else None) == gathered
    if zero == 3:  # ZeRO-3: k first-forward gathers and k reduce-scatters, each as one schedule step's
        one = model.estimate(replace(plan, schedule_steps=1))
        assert model.estimate(plan).zero_comm_s > one.zero_comm_s


def test_at_one_step_the_price_is_the_plans(model):
    plan = _plan(schedule_steps=1, zero_stage=3)
    assert model.estimate(plan) == model.estimate(Plan.from_dict(plan.to_dict()))
