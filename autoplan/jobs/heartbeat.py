"""A rank's heartbeat: the step and phase it is in, published for a watcher (autoplan/jobs/hang.py).

The runner and the trainer mark phases at cheap points, a few per micro-batch and never per op
(:meth:`Heartbeat.mark`: one tuple stored, no system call): "forward mb2", "gradient sync",
"optimizer step", "checkpoint save". Each mark advances a sequence number. A daemon thread
publishes the newest mark every ``period_s`` when it changed: to a file per rank in the local
launcher's folder (``AUTOPLAN_HEARTBEAT_DIR``), or under torchrun to a key of the job's TCPStore
(:class:`StoreSink`), where rank 0 watches. The thread keeps running while the main thread sleeps
or waits in a collective (both release the GIL), so a hung rank keeps publishing its last mark:
the watcher sees the number stop advancing. A phase is a ``kind``: ``compute`` (the rank's own
work), ``collective`` (waiting on the other ranks: a rank stopped there is a victim, not the cause)
or ``long`` (a checkpoint save, --verify's reference, the audit: no step-time prediction covers them).
``warm`` is False until the rank has finished its first step (compilation, first connections), and
``last_step_s`` carries the last step's measured time.
SIGUSR1 makes the rank print every thread's Python stack to its stderr (faulthandler), which the
launcher asks of a rank it declares hung. docs/executor.md, "Hung ranks".
"""

from __future__ import annotations

import faulthandler
import json
import os
import signal
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

HEARTBEAT_DIR_ENV = "AUTOPLAN_HEARTBEAT_DIR"
KINDS = ("compute", "collective", "long")


@dataclass(frozen=True)
class Beat:
    """One mark: where a rank is. ``step`` is None before the first step; ``at_s``: when it was marked
    (the rank's wall clock: it orders ranks that stopped within one publishing period); ``last_step_s``:
    the last step's measured time (the slowest rank's), None before the first step ends."""

    seq: int
    phase: str
    step: int | None = None
    kind: str = "compute"
    warm: bool = False
    at_s: float = 0.0
    last_step_s: float | None = None

    def to_text(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_text(cls, text: str | bytes) -> Beat | None:
        """The beat written by :meth:`to_text`, None for a torn or foreign text."""
        try:
            data = json.loads(text)
            return cls(**data) if isinstance(data, dict) else None
        except (ValueError, TypeError):
            return None

    def where(self) -> str:
        at = f"step {self.step}" if self.step is not None else "start-up"
        return f"{at}, '{self.phase}'"


class Sink(Protocol):
    def publish(self, rank: int, text: str) -> None: ...


class FileSink:
    """``DIR/rankR``, replaced whole (a reader never sees half a beat)."""

    def __init__(self, folder: Path):
        self.folder = folder

    def publish(self, rank: int, text: str) -> None:
        path = self.folder / f"rank{rank}"
        temporary = path.with_suffix(".tmp")
        temporary.write_text(text)
        os.replace(temporary, path)

    def read(self, ranks: int) -> dict[int, Beat]:
        """The newest beat of each rank that has published one."""
        beats = {}
        for rank in range(ranks):
            try:
                beat = Beat.from_text((self.folder / f"rank{rank}").read_text())
            except OSError:
                continue
            if beat is not None:
                beats[rank] = beat
        return beats


class StoreSink:
    """Key ``rankR`` of a (prefixed) torch.distributed store; opened in the thread that uses it."""

    def __init__(self, open_store: Any):
        self.open_store, self.store = open_store, None

    def publish(self, rank: int, text: str) -> None:
        if self.store is None:
            self.store = self.open_store()
        self.store.set(f"rank{rank}", text)


class Heartbeat:
    """This rank's marks and the thread that publishes them (module docstring)."""

    def __init__(self, *, rank: int, sink: Sink | None, period_s: float):
        self.rank, self.sink, self.period_s = rank, sink, period_s
        self._state = (0, "start-up", None, "long", False, time.time(), None)  # Beat's fields, in order
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def beat(self) -> Beat:
        return Beat(*self._state)

    def mark(self, phase: str, *, kind: str = "compute", step: int | None = None) -> None:
        """Enter ``phase`` (of ``step`` when given, else of the current step): one tuple stored."""
        seq, _, current, _, warm, _, last_step_s = self._state
        self._state = (seq + 1, phase, current if step is None else step, kind, warm, time.time(), last_step_s)

    def stepped(self, step_s: float) -> None:
        """A step ended after ``step_s``: from now on the deadline applies (the first step compiled and
        connected) and is at least 5 x this step (autoplan/jobs/hang.py)."""
        seq, phase, step, kind, _, at_s, _ = self._state
        self._state = (seq + 1, phase, step, kind, True, at_s, step_s)

    def start(self) -> Heartbeat:
        if self.sink is not None:
            if hasattr(signal, "SIGUSR1") and threading.current_thread() is threading.main_thread():
                faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True)
            self._thread = threading.Thread(target=self._publish, daemon=True, name="autoplan-heartbeat")
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _publish(self) -> None:
        last = -1
        while True:
            beat = self.beat
            if beat.seq != last:
                try:
                    self.sink.publish(self.rank, beat.to_text())  # type: ignore[union-attr]
                    last = beat.seq
                except Exception:  # noqa: BLE001 - a store gone at shutdown; the watcher judges silence
                    pass
            if self._stop.wait(self.period_s):
                return


def file_sink_from_env() -> FileSink | None:
    """The local launcher's heartbeat folder, when it gave one."""
    folder = os.environ.get(HEARTBEAT_DIR_ENV)
    return FileSink(Path(folder)) if folder else None
