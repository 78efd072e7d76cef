"""Start N local processes as one job, watch them, and stop them all on the first failure.

Each process runs ``python -m MODULE`` (the executor's ranks: ``autoplan.cli.rank``) with torchrun's environment
(RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT) and
AUTOPLAN_ERROR_DIR, where a failing rank writes one line saying why. Each rank's stderr is
passed through to ours and its last lines kept, for a rank that dies without a Python
exception (gloo aborts the process on a collective whose sizes disagree: "Received data size
doesn't match expected size"). The launcher polls every 0.1 s: when a rank exits non-zero,
every other rank is terminated (SIGTERM, then SIGKILL after ``grace_s``) and a RunError names
each rank that had failed and why (secondary "closed/reset by peer" failures last), so a
crash never waits for a collective timeout. The process groups also get a timeout
(``--timeout-s``, 45 s by default), so ranks that wait on each other forever (ops that
disagree, a hung rank) fail within a minute of the hang, under torchrun too. Ctrl-C
(KeyboardInterrupt), SIGTERM and SIGHUP (what Slurm and Kubernetes send) terminate every rank
the same way; a stop signal ends the launcher with exit 128 + signal and one sentence
(errors.StopSignal). Killed without a chance to clean up (SIGKILL), the launcher still takes its
ranks with it: each rank asks the kernel to end it when its parent dies
(autoplan/jobs/lifeline.py). With ``hang`` deadlines each rank publishes a heartbeat into the
temporary folder and a rank that stops advancing is declared hung within seconds (autoplan/jobs/hang.py):
the launcher asks it for its Python stack (SIGUSR1), stops every rank and names it, step and phase.
"""

from __future__ import annotations

import collections
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from autoplan.errors import RunError, StopSignal
from autoplan.jobs.hang import Deadlines, HangWatch
from autoplan.jobs.heartbeat import HEARTBEAT_DIR_ENV, FileSink
from autoplan.jobs.lifeline import LAUNCHER_PID_ENV

POLL_S = 0.1
SETTLE_S = 2.0
TAIL_LINES = 20
SECONDARY = ("by peer", "Connection closed", "Connection reset")
STACK_DUMP_S = 0.25  # a hung rank prints its stack (faulthandler, in its signal handler) before it is stopped


class Rank:
    """One launched rank: its process and the last lines of its stderr (passed through)."""

    def __init__(self, proc: subprocess.Popen):
        self.proc = proc
        self.tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
        self.reader = threading.Thread(target=self._pump, daemon=True)
        self.reader.start()

    def _pump(self) -> None:
        for line in self.proc.stderr:  # type: ignore[union-attr]
            sys.stderr.write(line)
            self.tail.append(line.rstrip())


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _env(*, rank: int, nprocs: int, port: int, error_dir: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(nprocs),
        LOCAL_WORLD_SIZE=str(nprocs),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        AUTOPLAN_ERROR_DIR=str(error_dir),
    )
    env[LAUNCHER_PID_ENV] = str(os.getpid())
    return env


def launch(
    *,
    args: list[str],
    nprocs: int,
    module: str,
    grace_s: float = 5.0,
    agreed_codes: tuple[int, ...] = (),
    hint: str = "",
    fork: bool = False,
    hang: Deadlines | None = None,
) -> int:
    """Run ``python -m module *args`` on ``nprocs`` local ranks; return rank 0's exit code.

    Raises RunError naming the first rank that failed: a non-zero exit other than the
    ``agreed_codes``, which every rank returns together (the executor's verify-failed code).
    ``hint`` ends a stop signal's message (where a checkpoint was written, to resume from);
    ``grace_s`` is how long stopped ranks get to leave (to write that checkpoint) before SIGKILL.
    ``fork``: fork each rank from this process (autoplan/jobs/forked.py: only from a process that started
    no OpenMP pool and no CUDA driver) instead of starting ``python -m module``. ``hang``: the heartbeat's
    deadlines (autoplan/jobs/hang.py), None to rely on the process groups' timeout alone."""
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="autoplan-run-") as error_dir, _stop_signals_raise(nprocs, hint):
        envs = [_env(rank=r, nprocs=nprocs, port=port, error_dir=Path(error_dir)) for r in range(nprocs)]
        beats = _heartbeat_folder(Path(error_dir), envs) if hang else None
        procs = [_start(module=module, args=args, env=env, fork=fork) for env in envs]
        ranks = [Rank(proc) for proc in procs]  # reader threads after the last fork: a child gets no held lock
        watch = _Hang(HangWatch(hang), beats) if hang and beats else None
        try:
            ok = (None, 0, *agreed_codes)
            return _watch(ranks=ranks, error_dir=Path(error_dir), grace_s=grace_s, ok=ok, hang=watch)
        finally:  # also on KeyboardInterrupt (Ctrl-C), which then propagates
            _stop(procs, grace_s=grace_s)


def _start(*, module: str, args: list[str], env: dict[str, str], fork: bool):
    """One rank's process: forked from this one (autoplan/jobs/forked.py), or ``python -m module``."""
    if fork:
        from autoplan.jobs.forked import ForkedRank

        return ForkedRank(module=module, args=args, env=env)
    command = [sys.executable, "-m", module, *args]
    return subprocess.Popen(command, stderr=subprocess.PIPE, text=True, errors="replace", env=env)


STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


class _stop_signals_raise:
    """While launching and watching: a stop signal raises StopSignal, so the ranks are stopped
    on the way out (launch's ``finally``); the previous handlers come back after. Only the main
    thread may set handlers; elsewhere (an API caller's thread) this does nothing."""

    def __init__(self, nprocs: int, hint: str = ""):
        self.nprocs, self.hint, self.previous = nprocs, hint, {}

    def __enter__(self) -> None:
        if threading.current_thread() is threading.main_thread():
            self.previous = {sig: signal.signal(sig, self._raise) for sig in STOP_SIGNALS}

    def __exit__(self, *exc) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)

    def _raise(self, signum, _frame) -> None:
        for sig in STOP_SIGNALS:  # a second signal must not interrupt stopping the ranks
            signal.signal(sig, signal.SIG_IGN)
        raise StopSignal(signum, self.nprocs, hint=self.hint)


def _heartbeat_folder(error_dir: Path, envs: list[dict[str, str]]) -> FileSink:
    folder = error_dir / "heartbeat"
    folder.mkdir()
    for env in envs:
        env[HEARTBEAT_DIR_ENV] = str(folder)
    return FileSink(folder)


class _Hang:
    """The launcher's side of the heartbeat: read the ranks' files every period, judge them."""

    def __init__(self, watch: HangWatch, beats: FileSink):
        self.watch, self.beats, self.next_read = watch, beats, 0.0

    def check(self, ranks: list[Rank], codes: list[int | None], grace_s: float) -> None:
        now = time.monotonic()
        if now < self.next_read:
            return
        self.next_read = now + self.watch.deadlines.period_s
        self.watch.see(self.beats.read(len(ranks)), now)
        gone = {rank for rank, code in enumerate(codes) if code is not None}
        if (verdict := self.watch.verdict(now, gone=gone)) is None:
            return
        for rank in verdict.culprits:  # its Python stack, printed by faulthandler into its stderr (passed through)
            ranks[rank].proc.send_signal(signal.SIGUSR1)
        time.sleep(STACK_DUMP_S)
        _stop([r.proc for r in ranks], grace_s=grace_s)
        hint = "its Python stack is printed above" if len(verdict.culprits) == 1 else "their stacks are printed above"
        raise RunError(
            f"hung: {verdict.message}; stopped all {len(ranks)} ranks ({hint}; if that phase legitimately takes this "
            "long, raise --hang-timeout-s)."
        )


def _watch(*, ranks: list[Rank], error_dir: Path, grace_s: float, ok: tuple, hang: _Hang | None = None) -> int:
    while True:
        codes = [r.proc.poll() for r in ranks]
        failed = [rank for rank, code in enumerate(codes) if code not in ok]
        if failed:
            codes = _settle(ranks)
            failed = [rank for rank, code in enumerate(codes) if code not in ok]
            _stop([r.proc for r in ranks], grace_s=grace_s)
            raise RunError(
                failure_message(
                    reasons={rank: (codes[rank], _reason(error_dir, rank, ranks[rank])) for rank in failed},
                    nprocs=len(ranks),
                )
            )
        if all(code is not None for code in codes):
            return codes[0] or max(codes)
        if hang is not None:
            hang.check(ranks, codes, grace_s)
        time.sleep(POLL_S)


def _settle(ranks: list[Rank]) -> list[int | None]:
    """Exit codes after giving the other ranks up to SETTLE_S to fail on their own: the first
    to exit is often a peer that saw the connection close, not the rank that caused it."""
    deadline = time.monotonic() + SETTLE_S
    while time.monotonic() < deadline and any(r.proc.poll() is None for r in ranks):
        time.sleep(POLL_S)
    return [r.proc.poll() for r in ranks]


def failure_message(*, reasons: dict[int, tuple[int, str]], nprocs: int) -> str:
    """One line naming every failed rank with its exit and reason; the ranks that failed only because a peer's
    connection closed (SECONDARY) are named after the cause without their gloo message, when a cause is known."""
    secondary = [rank for rank in sorted(reasons) if any(s in reasons[rank][1] for s in SECONDARY)]
    causes = [rank for rank in sorted(reasons) if rank not in secondary] or secondary
    same: dict[tuple[int, str], list[int]] = {}
    for rank in causes:  # ranks that failed alike (every rank refusing the same split) are named once
        same.setdefault(reasons[rank], []).append(rank)
    parts = [
        f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))} failed ({_exit(code)}): {why}"
        for (code, why), ranks in same.items()
    ]
    if lost := [rank for rank in secondary if rank not in causes]:
        names = ", ".join(map(str, lost))
        parts.append(
            f"rank{'s' if len(lost) > 1 else ''} {names} then lost {'their' if len(lost) > 1 else 'its'} connection"
        )
    return f"{'; '.join(parts)}; stopped all {nprocs} ranks."


def _exit(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def _reason_text(error_dir: Path, rank: int) -> str | None:
    """The exception the rank recorded before it failed, if any."""
    path = error_dir / f"rank{rank}.txt"
    return _clean(path.read_text().strip()) if path.is_file() else None


def _reason(error_dir: Path, rank: int, proc: Rank) -> str:
    """The rank's recorded exception, else the telling line of its stderr."""
    if (recorded := _reason_text(error_dir, rank)) is not None:
        return recorded
    proc.reader.join(timeout=1.0)
    lines = [line for line in proc.tail if line.strip()]
    telling = [line for line in lines if "what():" in line or "Error" in line or "error" in line]
    if telling or lines:
        return _clean((telling or lines)[-1].split("what():")[-1].strip())
    return "no error recorded (see its output above)"


def _clean(text: str) -> str:
    """Drop gloo/c10 source-location prefixes such as ``[/path/pair.cc:456] `` or ``[enforce fail at ...] ``."""
    return re.sub(r"\[(?:enforce fail at )?[^\]]*\.(?:cc|cpp|h):\d+\]\s*", "", text)


def _stop(procs: list[subprocess.Popen], *, grace_s: float) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    deadline = time.monotonic() + grace_s
    for proc in procs:
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
