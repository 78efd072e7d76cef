"""report/step_syncs.py: a k-schedule-step plan's dp terms split into each schedule step's and the optimizer
step's once, against what cost/dp/messages.py says each message's repetition is (docs/cost-model.md, "Schedule
steps"): ZeRO-3's gathers and reduce-scatters all per schedule step, ZeRO-1's sync all once, ZeRO-2's
reduce-scatter per schedule step beside its once-a-step weight all-gather."""

from __future__ import annotations

import pytest
from synthetic import gpt_graph, synthetic_profile

from autoplan.cost.model import CostModel
from autoplan.report.step_syncs import split_syncs
from autoplan.types.plan import Plan
from autoplan.types.schedule_steps import schedule_step_plan


@pytest.fixture(scope="module")
def model() -> CostModel:
    return CostModel(gpt_graph(layers=8, hidden=256, batch_size=8), synthetic_profile())


def _split(model, zero: int, k: int):
    plan = Plan(devices=4, dp=2, tp=1, pp=2, micro_batch_size=1, num_microbatches=8, zero_stage=zero, schedule_steps=k)
    cost, step = model.estimate(plan), model.estimate(schedule_step_plan(plan))
    return cost, step, split_syncs(cost, step, k)


@pytest.mark.parametrize("k", [2, 4])
@pytest.mark.parametrize("zero", [1, 2, 3])
def test_k_per_step_and_once_add_up_to_the_priced_terms(model, zero, k):
    cost, step, syncs = _split(model, zero, k)
    whole = (cost.dp_comm_s, cost.dp_comm_exposed_s, cost.zero_comm_s)
    for total, per, once in zip(whole, syncs.per_step, syncs.once):
        assert k * per + once == pytest.approx(total, rel=1e-12, abs=1e-18) and per >= 0 and once >= 0
    if zero == 3:  # every ZeRO-3 message is sent each schedule step
        assert syncs.once[2] == pytest.approx(0.0, abs=1e-15) and syncs.per_step[2] == pytest.approx(step.zero_comm_s)
        assert cost.zero_comm_s > 0
    if zero == 2:  # the reduce-scatter each schedule step, the updated weights gathered once
        assert syncs.per_step[1] > 0 and syncs.once[1] > 0
        assert syncs.per_step[1] + syncs.once[1] == pytest.approx(step.dp_comm_exposed_s)
    if zero == 1:  # ZeRO-1 reduce-scatters after the k-th step's backward: nothing per schedule step
        assert syncs.per_step == pytest.approx((0.0, 0.0, 0.0), abs=1e-15) and syncs.once[0] > 0


def test_one_schedule_step_is_all_once(model):
    cost, _, syncs = _split(model, 2, 1)
    assert syncs.per_step == (0.0, 0.0, 0.0) and syncs.once == (cost.dp_comm_s, cost.dp_comm_exposed_s, 0.0)
