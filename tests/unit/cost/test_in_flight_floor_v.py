"""schedule_weights (cost/memory/in_flight_floor.py) has no floor for a V schedule: it answers None before it reads any
rank's count, each of which replays the rank's order (cost/pp/replay.py), and a looped schedule's weights are as
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
def test_a_v_schedule_has_no_weights_and_reads_no_rank(schedule, monkeypatch):
    def unread(*args, **kwargs):
        raise AssertionError("a V schedule's ranks are not read")

    monkeypatch.setattr(in_flight_floor, "in_flight_after_first_backward", unread)
    monkeypatch.setattr(in_flight_floor, "held_floor", unread)
    assert in_flight_floor.schedule_weights(_plan(schedule, 2)) is None


@pytest.mark.parametrize(("schedule", "v"), [("1f1b", 1), ("interleaved_1f1b", 2), ("interleaved_zb", 2)])
def test_a_looped_schedule_s_weights_read_every_rank(schedule, v):
    most, harmonic, owed = in_flight_floor.schedule_weights(_plan(schedule, v))
    assert most >= 1 and 0 < harmonic <= 4 and owed >= 0
