"""Start N local processes for a plan, watch them, and stop them all on the first failure.

Each process runs ``python -m autoplan.execute.runner`` with torchrun's environment
(RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT) and
AUTOPLAN_ERROR_DIR, where a failing rank writes one line saying why. The launcher polls
every 0.1 s: when a rank exits non-zero, every other rank is terminated (SIGTERM, then
SIGKILL after ``grace_s``) and a RunError names the rank and its reason, so a crash never
waits for a collective timeout. The process groups also get a timeout (``--timeout-s``,
45 s by default) so a mismatched collective fails within a minute under torchrun too.
Ctrl-C terminates every rank the same way.
"""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from autoplan.errors import RunError

POLL_S = 0.1


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _env(*, rank: int, nprocs: int, port: int, error_dir: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(nprocs), LOCAL_WORLD_SIZE=str(nprocs),
               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), AUTOPLAN_ERROR_DIR=str(error_dir))
    return env


def launch(*, args: list[str], nprocs: int, grace_s: float = 5.0, module: str = "autoplan.execute.runner") -> int:
    """Run ``python -m module *args`` on ``nprocs`` local ranks; return rank 0's exit code.

    Raises RunError naming the first rank that failed (non-zero exit other than the
    agreed verify-failed code, which every rank returns together)."""
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="autoplan-run-") as error_dir:
        procs = [subprocess.Popen([sys.executable, "-m", module, *args],
                                  env=_env(rank=r, nprocs=nprocs, port=port, error_dir=Path(error_dir)))
                 for r in range(nprocs)]
        try:
            return _watch(procs=procs, error_dir=Path(error_dir), grace_s=grace_s)
        except KeyboardInterrupt:
            _stop(procs, grace_s=grace_s)
            raise
        finally:
            _stop(procs, grace_s=grace_s)


def _watch(*, procs: list[subprocess.Popen], error_dir: Path, grace_s: float) -> int:
    from autoplan.execute.runner import EXIT_VERIFY_FAILED
    while True:
        codes = [p.poll() for p in procs]
        for rank, code in enumerate(codes):
            if code not in (None, 0, EXIT_VERIFY_FAILED):
                _stop(procs, grace_s=grace_s)
                raise RunError(f"rank {rank} failed (exit code {code}): {_reason(error_dir, rank, code)}; stopped all {len(procs)} ranks.")
        if all(code is not None for code in codes):
            return codes[0] or max(codes)
        time.sleep(POLL_S)


def _reason(error_dir: Path, rank: int, code: int) -> str:
    path = error_dir / f"rank{rank}.txt"
    if path.is_file():
        return path.read_text().strip()
    if code < 0:
        return f"killed by signal {-code}"
    return "no error recorded (see its output above)"


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
