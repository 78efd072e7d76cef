"""Plan.schedule_steps (types/schedule_steps.py): k pipeline schedule steps of m / k micro-batches per optimizer
step; its rules in one sentence each, the schedule's own rules read per schedule step, JSON and the summary."""

from __future__ import annotations

from dataclasses import replace

import pytest

from autoplan.errors import PlanError
from autoplan.types.plan import Plan
from autoplan.types.schedule_steps import schedule_step_plan


def _plan(**changes) -> Plan:
    fields = dict(dp=2, tp=1, pp=4, micro_batch_size=1, num_microbatches=32, schedule_steps=4)
    fields.update(changes)
    return Plan(devices=fields["dp"] * fields["tp"] * fields["pp"], **fields)


@pytest.mark.parametrize(
    "changes, says",
    [
        (dict(schedule_steps=0), "schedule_steps=0; expected an integer >= 1"),
        (dict(schedule_steps=3), "does not divide num_microbatches=32"),
        (dict(pp=1), "with pp=1: without a pipeline the micro-batches already accumulate"),
        (dict(runtime="megatron"), "only runtimes that run torch's pipeline schedules"),
        (dict(schedule="zbv", virtual_stages=2, schedule_steps=8), "(4 per schedule step): a V schedule needs"),
        (dict(schedule="interleaved_zb", schedule_steps=16), "(2 per schedule step): a zero-bubble schedule"),
    ],
)
def test_each_rule_is_one_sentence(changes, says):
    with pytest.raises(PlanError) as caught:
        _plan(**changes)
    assert says in str(caught.value) and str(caught.value).count("\n") == 0


def test_the_schedule_rules_read_one_schedule_step():
    _plan(schedule="zbv", virtual_stages=2, schedule_steps=4)  # 8 per step = 2 pp: a V runs it
    _plan(schedule="interleaved_zb", schedule_steps=8)  # 4 per step = pp


def test_json_and_summary_show_it_only_away_from_one():
    plan = _plan()
    assert plan.to_dict()["schedule_steps"] == 4 and Plan.from_dict(plan.to_dict()) == plan
    assert plan.describe().endswith(" steps=4") and plan.global_batch_size == 2 * 32
    single = _plan(schedule_steps=1)
    assert "schedule_steps" not in single.to_dict() and "steps=" not in single.describe()


def test_one_schedule_step_is_the_plan_with_m_over_k():
    step = schedule_step_plan(plan := _plan(schedule="interleaved_zb", recompute="full"))
    assert (step.num_microbatches, step.schedule_steps) == (8, 1)
    assert step.__dict__ == replace(plan, num_microbatches=8, schedule_steps=1).__dict__  # a copy, unchecked
    single = _plan(schedule_steps=1)
    assert schedule_step_plan(single) is single
