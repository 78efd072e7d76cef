"""Declare a rank hung from the heartbeats (autoplan/jobs/heartbeat.py), and say which one and where.

Deadlines, with P the plan's predicted step time, C its predicted checkpoint write and T --timeout-s:

    step deadline  D = max(--hang-timeout-s (10 s), 5 P, 5 M)     issue 38: "10 s, or 5x the predicted
                                                                  step time if that is longer"; M: the
                                                                  rank's last measured step, so a plan
                                                                  mispredicted (another device) is safe
    long phases    L = max(D, T, 5 C)                             checkpoint save, --verify, the audit:
                                                                  unpredicted, and their closing collective
                                                                  already waits up to T for the slowest rank

A rank whose mark has not advanced for its phase's deadline is overdue; before its first step ends
(compilation, first connections: nothing predicts them) it is not watched, and the collective timeout
stays the bound there and the second line of defence everywhere. The ranks stopped for D / 2 or more
are judged, and the job is declared hung when one that stopped the others is overdue (a rank that
waits for a long checkpoint save is not): ranks waiting in a collective are victims; of the
rest, those furthest behind (the fewest marks: every rank marks the same phases in the same order,
and the others wait for the one behind at the next collective it has not reached); of those, the
smallest group sharing a phase (ties: the group whose mark is oldest by the ranks' clocks). So a
rank waiting inside a phase that does not say it is a collective (DDP's all-reduce in the backward,
ZeRO-1's reduce-scatter in the optimizer step) is still told from the one it waits for.
docs/executor.md, "Hung ranks".
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from autoplan.jobs.heartbeat import Beat
from autoplan.types.run_options import RunOptions

STEP_FACTOR = 5  # issue 38: a rank is hung after 5x the predicted step time (or the floor)
SAMPLES_PER_DEADLINE = 20  # publish and read 20 times per deadline: the stall is seen within 10% of it
MAX_PERIOD_S = 1.0
MIN_PERIOD_S = 0.05


@dataclass(frozen=True)
class Deadlines:
    """How long a rank may go without a new mark (module docstring)."""

    floor_s: float = RunOptions.hang_timeout_s  # issue 38: "a hung rank is detected within 10 s"
    predicted_step_s: float | None = None
    timeout_s: float = RunOptions.timeout_s
    checkpoint_write_s: float | None = None

    @classmethod
    def for_plan(cls, plan: Any, *, floor_s: float, timeout_s: float) -> Deadlines | None:
        """The deadlines of ``plan`` (its prediction, when it has one); None when ``floor_s`` is 0 (off)."""
        if floor_s <= 0:
            return None
        predicted = plan.predicted
        step_s = predicted.step_time_s if predicted else None
        write_s = predicted.checkpoint_write_s if predicted else None
        return cls(floor_s=floor_s, predicted_step_s=step_s, timeout_s=timeout_s, checkpoint_write_s=write_s)

    @property
    def step_s(self) -> float:
        return max(self.floor_s, STEP_FACTOR * (self.predicted_step_s or 0.0))

    @property
    def long_s(self) -> float:
        return max(self.step_s, self.timeout_s, STEP_FACTOR * (self.checkpoint_write_s or 0.0))

    @property
    def period_s(self) -> float:
        return min(MAX_PERIOD_S, max(MIN_PERIOD_S, self.step_s / SAMPLES_PER_DEADLINE))

    def of(self, beat: Beat) -> float | None:
        """``beat``'s deadline: its phase's, and at least 5 x the rank's last measured step; None warming up."""
        if not beat.warm:
            return None
        return max(self.long_s if beat.kind == "long" else self.step_s, STEP_FACTOR * (beat.last_step_s or 0.0))

    def formula(self, beat: Beat) -> str:
        predicted, measured = _seconds(self.predicted_step_s), _seconds(beat.last_step_s)
        step = (
            f"--hang-timeout-s {self.floor_s:g}, {STEP_FACTOR} x the plan's predicted step {predicted}, "
            f"{STEP_FACTOR} x the last measured step {measured}"
        )
        if beat.kind != "long":
            return f"{self.of(beat):.3g} s = max({step})"
        return (
            f"{self.of(beat):.3g} s = max({step}, --timeout-s {self.timeout_s:g}, {STEP_FACTOR} x the predicted "
            f"checkpoint write {_seconds(self.checkpoint_write_s)}), as '{beat.phase}' is not a predicted step phase"
        )


def _seconds(value: float | None) -> str:
    return "(none)" if value is None else f"{value:.3g} s"


@dataclass
class Seen:
    beat: Beat
    since: float  # when the watcher first saw this mark (its own clock)


@dataclass(frozen=True)
class Verdict:
    culprits: tuple[int, ...]
    message: str  # one sentence, without the "stopped all N ranks" that the caller adds


class HangWatch:
    """Feed it the beats it reads (:meth:`see`); ask it whether a rank is hung (:meth:`verdict`)."""

    def __init__(self, deadlines: Deadlines):
        self.deadlines = deadlines
        self.seen: dict[int, Seen] = {}

    def see(self, beats: dict[int, Beat], now: float) -> None:
        for rank, beat in beats.items():
            old = self.seen.get(rank)
            if old is None or old.beat.seq != beat.seq:
                self.seen[rank] = Seen(beat=beat, since=now)

    def verdict(self, now: float, *, gone: set[int] | frozenset[int] = frozenset()) -> Verdict | None:
        """A verdict when the ranks that stopped the others (not in ``gone``: exited) are overdue, else None."""
        stopped = {r: s for r, s in self.seen.items() if r not in gone and now - s.since >= self.deadlines.step_s / 2}
        if not stopped:
            return None
        culprits = culprits_of(stopped)
        if not any(
            (d := self.deadlines.of(stopped[r].beat)) is not None and now - stopped[r].since >= d for r in culprits
        ):
            return None  # still within its phase's deadline (or warming up), however long the others wait for it
        return Verdict(culprits=tuple(culprits), message=self._message(culprits, stopped, now))

    def _message(self, culprits: list[int], stopped: dict[int, Seen], now: float) -> str:
        first = stopped[culprits[0]]
        stalled_s = now - min(seen.since for seen in stopped.values())  # how long the job has not moved
        where = "; ".join(f"{_ranks([r])} stopped at {stopped[r].beat.where()}" for r in culprits[:4])
        more = f" (and {len(culprits) - 4} more)" if len(culprits) > 4 else ""
        victims = _grouped({r: s for r, s in stopped.items() if r not in culprits})
        waiting = f"; {victims} (waiting for {'it' if len(culprits) == 1 else 'them'})" if victims else ""
        return (
            f"{where}{more}: no heartbeat progress for {stalled_s:.1f} s (deadline "
            f"{self.deadlines.formula(first.beat)}){waiting}"
        )


def culprits_of(stopped: dict[int, Seen]) -> list[int]:
    """The ranks that stopped the others (module docstring's rule)."""
    outside = [r for r, s in stopped.items() if s.beat.kind != "collective"] or list(stopped)
    fewest = min(stopped[r].beat.seq for r in outside)
    behind = [r for r in outside if stopped[r].beat.seq == fewest]
    groups: dict[str, list[int]] = {}
    for rank in sorted(behind):
        groups.setdefault(stopped[rank].beat.phase, []).append(rank)
    if len(groups) == 1:
        return sorted(behind)
    return min(groups.values(), key=lambda ranks: (len(ranks), min(stopped[r].beat.at_s for r in ranks)))


def _grouped(seen: dict[int, Seen]) -> str:
    """``ranks 0, 2 wait at step 3, 'gradient sync'; rank 5 ...`` (the three largest groups)."""
    groups: dict[str, list[int]] = {}
    for rank in sorted(seen):
        groups.setdefault(seen[rank].beat.where(), []).append(rank)
    largest = sorted(groups.items(), key=lambda item: -len(item[1]))
    return "; ".join(
        f"{_ranks(ranks)} {'waits' if len(ranks) == 1 else 'wait'} at {where}" for where, ranks in largest[:3]
    )


def _ranks(ranks: list[int]) -> str:
    shown = ", ".join(str(r) for r in ranks[:8]) + (f" and {len(ranks) - 8} more" if len(ranks) > 8 else "")
    return f"rank {shown}" if len(ranks) == 1 else f"ranks {shown}"


def watch_store(
    *, open_store: Callable[[], Any], ranks: int, deadlines: Deadlines, on_hang: Callable[[Verdict], None]
) -> threading.Thread:
    """Under torchrun: a daemon thread (rank 0's) that reads every rank's key and calls ``on_hang``."""

    def loop() -> None:
        store, watch = open_store(), HangWatch(deadlines)
        keys = [f"rank{rank}" for rank in range(ranks)]
        try:  # every rank publishes when it starts its heartbeat, right after the process group's start
            store.wait(keys)  # the store's own timeout (--timeout-s): a rank that never came is torchrun's to end
        except Exception:  # noqa: BLE001
            return
        while True:
            time.sleep(deadlines.period_s)
            try:
                values = store.multi_get(keys)
            except Exception:  # noqa: BLE001 - the store's host went away: the job is ending
                return
            beats = {rank: b for rank, v in enumerate(values) if (b := Beat.from_text(bytes(v))) is not None}
            watch.see(beats, time.monotonic())
            if (verdict := watch.verdict(time.monotonic())) is not None:
                on_hang(verdict)
                return

    thread = threading.Thread(target=loop, daemon=True, name="autoplan-hang-watch")
    thread.start()
    return thread
