"""The heartbeat's judge (autoplan/jobs/hang.py) on synthetic beats and a clock of our own: the deadline
is max(--hang-timeout-s, 5 x the predicted step), longer in a checkpoint save, absent before the first
step ends; the rank named is the one the others wait for, not one waiting in a collective; a slow rank
that keeps marking is never hung. Then the real publishers: files read by autoplan's launcher (a job of
plain processes, no torch) and a TCPStore read by rank 0's watcher thread (torchrun's case)."""

from __future__ import annotations

import queue
import textwrap
from pathlib import Path

import pytest

from autoplan.errors import RunError
from autoplan.jobs.hang import Deadlines, HangWatch, watch_store
from autoplan.jobs.heartbeat import Beat, Heartbeat, StoreSink
from autoplan.jobs.launcher import launch
from autoplan.types.plan import Plan
from autoplan.types.prediction import Prediction
from autoplan.types.run_options import RunOptions

ROOT = Path(__file__).resolve().parents[3]
PLAN = dict(devices=2, dp=2, tp=1, pp=1, micro_batch_size=1, num_microbatches=1)


def _beat(seq: int, phase: str, *, step: int = 3, kind: str = "compute", at_s: float = 0.0) -> Beat:
    return Beat(seq=seq, phase=phase, step=step, kind=kind, warm=True, at_s=at_s)


def test_the_deadline_is_the_floor_or_five_predicted_steps_and_longer_in_a_save():
    short = Deadlines.for_plan(Plan(**PLAN, predicted=Prediction(step_time_s=0.4)), floor_s=10, timeout_s=45)
    assert short.step_s == 10 and short.long_s == 45
    slow = Prediction(step_time_s=3.0, checkpoint_write_s=20.0)
    long = Deadlines.for_plan(Plan(**PLAN, predicted=slow), floor_s=10, timeout_s=45)
    assert long.step_s == 15 and long.long_s == 100  # 5 x the predicted write
    assert long.of(_beat(1, "checkpoint save", kind="long")) == 100
    assert long.of(Beat(seq=1, phase="forward mb0")) is None  # warming up: not watched
    assert Deadlines.for_plan(Plan(**PLAN), floor_s=0, timeout_s=45) is None  # --hang-timeout-s 0: off


def test_a_negative_hang_timeout_is_one_sentence():
    with pytest.raises(RunError, match="--hang-timeout-s -1"):
        RunOptions(model="m.py", plan="p.json", out="r", hang_timeout_s=-1)


def test_the_rank_outside_the_collective_is_named_not_the_ones_waiting():
    watch = HangWatch(Deadlines(floor_s=10))
    waiting = _beat(9, "gradient sync", kind="collective")
    watch.see({0: waiting, 1: _beat(7, "forward mb0"), 2: waiting}, 0.0)
    assert watch.verdict(9.9) is None
    verdict = watch.verdict(10.0)
    assert verdict.culprits == (1,)
    assert verdict.message.startswith("rank 1 stopped at step 3, 'forward mb0': no heartbeat progress for 10.0 s")
    assert "ranks 0, 2 wait at step 3, 'gradient sync' (waiting for it)" in verdict.message


def test_the_rank_furthest_behind_is_named_when_the_waiting_phase_hides_its_collective():
    """ZeRO-1's reduce-scatter runs inside 'optimizer step': rank 0 got there, rank 1 is still in its forward."""
    watch = HangWatch(Deadlines(floor_s=10))
    watch.see({0: _beat(12, "optimizer step", at_s=0.0), 1: _beat(10, "forward mb0", at_s=1.0)}, 0.0)
    assert watch.verdict(10.0).culprits == (1,)


def test_a_plan_that_mispredicts_its_step_gets_five_measured_steps():
    """A plan priced for a faster device: its 0.1 s prediction would allow 10 s, the measured 4 s step 20 s."""
    watch = HangWatch(Deadlines(floor_s=10, predicted_step_s=0.1))
    beat = Beat(seq=40, phase="forward mb0", step=7, warm=True, last_step_s=4.0)
    watch.see({0: beat}, 0.0)
    assert watch.verdict(19.0) is None
    formula = "max(--hang-timeout-s 10, 5 x the plan's predicted step 0.1 s, 5 x the last measured step 4 s)"
    assert f"deadline 20 s = {formula}" in watch.verdict(20.0).message


def test_a_rank_keeping_its_marks_coming_is_never_hung():
    watch = HangWatch(Deadlines(floor_s=1, predicted_step_s=0.4))  # deadline 2 s; its steps take 1.2 s
    for tick in range(1, 40):
        now = tick * 0.6
        watch.see({0: _beat(tick, f"phase {tick % 2}"), 1: _beat(tick // 2, "forward mb0")}, now)
        assert watch.verdict(now) is None


def test_a_long_save_is_waited_for_and_then_named():
    watch = HangWatch(Deadlines(floor_s=10, timeout_s=45))
    waiting = _beat(21, "step time and loss all-reduce", kind="collective")
    watch.see({0: _beat(20, "checkpoint save", kind="long"), 1: waiting}, 0.0)
    assert watch.verdict(30.0) is None  # rank 1 waits past its 10 s, but rank 0 is within the save's 45 s
    verdict = watch.verdict(45.0)
    assert verdict.culprits == (0,) and "is not a predicted step phase" in verdict.message


def test_a_warming_up_rank_is_not_watched():
    watch = HangWatch(Deadlines(floor_s=10))
    watch.see({0: Beat(seq=3, phase="forward mb0", step=0), 1: Beat(seq=3, phase="forward mb0", step=0)}, 0.0)
    assert watch.verdict(600.0) is None


RANK_MODULE = """
import os, time
from autoplan.jobs.heartbeat import Heartbeat, file_sink_from_env

rank = int(os.environ["RANK"])
beat = Heartbeat(rank=rank, sink=file_sink_from_env(), period_s=0.05).start()
beat.mark("batch", step=0)
beat.stepped(0.01)
for step in range(1, 1000):
    beat.mark("forward mb0", step=step)
    if rank == 1 and step == 3:
        time.sleep(3600)  # rank 1 hangs in step 3's forward; rank 0 goes on marking
    time.sleep(0.05)
    beat.mark("gradient sync", kind="collective")
"""


def test_the_launcher_stops_a_job_whose_rank_stopped_and_names_it(tmp_path, monkeypatch):
    """Plain processes publishing through the files the launcher reads: rank 1 stops in step 3 while
    rank 0 keeps stepping; the launcher asks rank 1 for its stack, stops both and names rank 1."""
    (tmp_path / "hang_rank.py").write_text(textwrap.dedent(RANK_MODULE))
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}:{ROOT}")
    with pytest.raises(RunError) as error:
        launch(args=[], nprocs=2, module="hang_rank", grace_s=1.0, hang=Deadlines(floor_s=1.0))
    text = str(error.value)
    assert text.startswith("hung: rank 1 stopped at step 3, 'forward mb0'"), text
    assert "stopped all 2 ranks" in text


def test_rank_zero_watches_the_other_ranks_through_the_store():
    """torchrun's case: each rank publishes into the job's TCPStore, a thread reads every key."""
    import torch.distributed as dist

    master = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)

    def client():
        return dist.PrefixStore("autoplan/heartbeat/attempt0", dist.TCPStore("127.0.0.1", master.port, is_master=False))

    beats = [Heartbeat(rank=rank, sink=StoreSink(client), period_s=0.05).start() for rank in range(3)]
    for rank, beat in enumerate(beats):
        beat.mark("batch", step=5)
        beat.stepped(0.01)
        beat.mark("forward mb1" if rank == 2 else "gradient sync", kind="compute" if rank == 2 else "collective")
    verdicts: queue.Queue = queue.Queue()
    watch_store(open_store=client, ranks=3, deadlines=Deadlines(floor_s=0.5), on_hang=verdicts.put)
    verdict = verdicts.get(timeout=60)
    for beat in beats:
        beat.stop()
    assert verdict.culprits == (2,)
    assert verdict.message.startswith("rank 2 stopped at step 5, 'forward mb1'")
    assert "ranks 0, 1 wait at step 5, 'gradient sync'" in verdict.message
