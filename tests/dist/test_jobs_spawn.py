"""The job layer's in-process ranks (autoplan/jobs/spawn.py): results by rank, one-sentence failures."""

from __future__ import annotations

import os

import pytest

from autoplan.errors import RunError
from autoplan.jobs.spawn import report, spawn_ranks

pytestmark = pytest.mark.slow


def _report(rank, world, port, scale, messages):
    messages.put(("tick", f"rank {rank} of {world}"))
    report(messages, rank, lambda: (rank * scale, port))


def _boom(rank):
    raise ValueError(f"boom on {rank}")


def _raise(rank, world, port, messages):
    report(messages, rank, lambda: _boom(rank))


def _die(rank, world, port, messages):
    os._exit(7)


def _hang(rank, world, port, messages):
    import time

    time.sleep(60)


def test_every_rank_reports_its_value_on_one_port():
    ticks = []
    values = spawn_ranks(_report, processes=3, args=(10,), timeout_s=60, on_tick=ticks.append, what="testing")
    assert sorted(values) == [0, 1, 2] and [values[r][0] for r in range(3)] == [0, 10, 20]
    assert len({port for _, port in values.values()}) == 1 and len(ticks) == 3


@pytest.mark.parametrize(
    "worker, message",
    [
        (_raise, "rank 0 failed while testing: ValueError: boom on 0"),
        (_die, "exited with code 7 before reporting while testing"),
        (_hang, "testing did not finish in 3 s"),
    ],
)
def test_a_failing_rank_is_one_sentence(worker, message):
    with pytest.raises(RunError, match=message):
        spawn_ranks(worker, processes=1, args=(), timeout_s=3, what="testing")


def _environ(rank, world, port, messages):
    report(messages, rank, lambda: os.environ.get("AUTOPLAN_TEST_SPAWN_ENV"))


def test_each_call_runs_its_ranks_in_the_callers_environment(monkeypatch):
    """The ranks fork from a server started at the first call: a variable set or changed after it
    reaches the next call's ranks, as it reached ranks spawned fresh."""
    seen = []
    for value in ("first", "second"):
        monkeypatch.setenv("AUTOPLAN_TEST_SPAWN_ENV", value)
        seen.append(spawn_ranks(_environ, processes=2, args=(), timeout_s=60, what="testing"))
    assert seen == [{0: "first", 1: "first"}, {0: "second", 1: "second"}]


def _overdue(rank, world, port, folder, messages):
    import time
    from pathlib import Path

    time.sleep(8)  # longer than the deadline, shorter than the 10 s a job that reported gets to leave
    Path(folder, "finished").touch()


def test_a_rank_past_the_deadline_is_ended_not_waited_for(tmp_path):
    """After a failure the other ranks have nothing to finish: spawn_ranks ends them at once. It used
    to join them for 10 s first, so a rank still sleeping at the deadline woke up and finished."""
    with pytest.raises(RunError, match="did not finish in 2 s"):
        spawn_ranks(_overdue, processes=1, args=(str(tmp_path),), timeout_s=2, what="testing")
    assert not (tmp_path / "finished").exists()  # ended: a joined rank would be done by now
