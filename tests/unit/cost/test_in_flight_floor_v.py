"""schedule_weights (cost/memory/in_flight_floor.py) reads a V schedule's counts as the other replayed schedules': each
device's from its replayed order (``held_floor``, cost/memory/replayed.py), the same counts the floor on a plan's
own stages reads (device_counts with every_schedule, solve/stage_floor.py); a looped schedule's weights are as
before."""

from __future__ import annotations

import pytest

from autoplan.cost.memory import in_flight_floor
from autoplan.types.plan import Plan


def _plan(schedule: str, v: int) -> Plan:
    return Plan.unchecked(
        devices=4, dp=1, tp=1, pp=4, schedule=schedule, virtual_stages=v, num_microbatches=8, micro_batch_size=1
    )


@pytest.mark.parametrize("schedule", ["zbv", "dualpipev"])
def test_a_v_schedule_s_weights_are_its_replayed_ranks_counts(schedule):
    plan = _plan(schedule, 2)
    counts = in_flight_floor.device_counts(plan, every_schedule=True)
    held = [n for n, _ in counts]
    assert min(held) > 0
    expected = (max(held), sum(1.0 / n for n in held), min(p / n for n, p in counts))
    assert in_flight_floor.schedule_weights(plan) == expected


@pytest.mark.parametrize(("schedule", "v"), [("1f1b", 1), ("interleaved_1f1b", 2), ("interleaved_zb", 2)])
def test_a_looped_schedule_s_weights_read_every_rank(schedule, v):
    most, harmonic, owed = in_flight_floor.schedule_weights(_plan(schedule, v))
    assert most >= 1 and 0 < harmonic <= 4 and owed >= 0
