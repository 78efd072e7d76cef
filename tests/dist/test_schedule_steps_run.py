"""Plan.schedule_steps run (execute/pipeline.py, execute/trainer.py): k schedule steps of m / k micro-batches, then one
optimizer step, match the single-process reference `autoplan run --verify` compares against (loss, every gradient,
every updated weight), on one spawned 2-rank gloo group shared by the cases (tests/dist/exec_harness.py); torch's
schedule is stepped k times per optimizer step, each over m / k micro-batches."""

from __future__ import annotations

from unittest import mock

import pytest
from exec_harness import _spawn, run_case
from test_execute import _check
from torch.distributed.pipelining.schedules import PipelineScheduleMulti, PipelineScheduleSingle

CASES = [
    ("pp2_1f1b_two_steps", "gpt", dict(pp=2, schedule="1f1b", num_microbatches=4, schedule_steps=2)),
    ("pp2_interleaved_two_steps", "gpt",
     dict(pp=2, schedule="interleaved_1f1b", virtual_stages=2, num_microbatches=8, schedule_steps=2)),
]  # fmt: skip


def _counting(cls, calls: list):
    """``cls.step`` recording each call's micro-batches (the schedule's ``_n_microbatches``)."""
    step = cls.step

    def counted(self, *args, **kwargs):
        calls.append(self._n_microbatches)
        return step(self, *args, **kwargs)

    return mock.patch.object(cls, "step", counted)


def stepped_case(model_name, plan) -> dict:
    """tests/dist/exec_harness.py run_case, with the micro-batches of every schedule step it ran."""
    calls: list[int] = []
    with _counting(PipelineScheduleSingle, calls), _counting(PipelineScheduleMulti, calls):
        found = run_case(model_name, plan)
    return {**found, "schedule_calls": calls, "optimizer_steps": len(found.get("steps", []))}


@pytest.fixture(scope="module")
def two():
    return _spawn(2, CASES, stepped_case)


@pytest.mark.parametrize("name, kw", [(c[0], c[2]) for c in CASES])
def test_schedule_steps_match_reference(two, name, kw):
    _check(two, name)
    k, m = kw["schedule_steps"], kw["num_microbatches"]
    calls = two[name]["schedule_calls"]
    assert set(calls) == {m // k} and len(calls) % k == 0 and len(calls) >= k * two[name]["optimizer_steps"], calls
