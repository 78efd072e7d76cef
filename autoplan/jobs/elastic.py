"""Start N local ranks under torchelastic's agent, which restarts them all when one fails.

``autoplan run --max-restarts K`` uses this instead of :mod:`autoplan.jobs.launcher`: the agent
of ``torchrun`` (``torch.distributed.launcher.api.elastic_launch``, a c10d rendezvous on this
host) runs ``python -m MODULE ARGS`` on each rank; when a rank dies, it stops the others and
starts the whole group again, up to K times, with ``TORCHELASTIC_RESTART_COUNT`` set to the
attempt, so each rank resumes from the newest checkpoint (autoplan/execute/job/checkpointing.py).
The agent also handles SIGTERM, SIGINT and SIGHUP: it passes the signal to the ranks, which write
a final checkpoint, and ends them after its shutdown timeout. The ranks' lifeline points at this
process (autoplan/jobs/lifeline.py), so a launcher killed with SIGKILL still takes them along.
After K restarts the job stops with one sentence naming the failed rank and why.
"""

from __future__ import annotations

import logging
import os
import sys
import tempfile
import uuid
from pathlib import Path

from autoplan.errors import RunError, StopSignal
from autoplan.jobs.environ import environment
from autoplan.jobs.launcher import _reason_text, free_port
from autoplan.jobs.lifeline import LAUNCHER_PID_ENV

SHUTDOWN_TIMEOUT_S = 60  # time the ranks get to write a final checkpoint after a stop signal


def launch_elastic(*, args: list[str], nprocs: int, module: str, max_restarts: int, hint: str = "") -> int:
    """Run ``python -m module *args`` on ``nprocs`` local ranks with up to ``max_restarts``
    restarts; 0 when they all finished, else RunError (or StopSignal)."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    logging.getLogger("torch.distributed.elastic").setLevel(logging.WARNING)
    config = LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=nprocs,
        run_id=f"autoplan-{uuid.uuid4().hex[:8]}",
        rdzv_backend="c10d",
        rdzv_endpoint=f"127.0.0.1:{free_port()}",
        max_restarts=max_restarts,
        monitor_interval=0.1,
        shutdown_timeout=SHUTDOWN_TIMEOUT_S,
    )
    with tempfile.TemporaryDirectory(prefix="autoplan-run-") as error_dir:
        env = ((LAUNCHER_PID_ENV, str(os.getpid())), ("AUTOPLAN_ERROR_DIR", error_dir))
        with environment(env):
            try:
                elastic_launch(config, sys.executable)("-m", module, *args)
                return 0
            except ChildFailedError as exc:
                raise RunError(_failed(exc, error_dir=Path(error_dir), max_restarts=max_restarts, hint=hint)) from None
            except SignalException as exc:
                raise StopSignal(int(exc.sigval), nprocs, hint=hint) from None


def _failed(exc, *, error_dir: Path, max_restarts: int, hint: str) -> str:
    """One sentence: which rank failed on the last attempt and why, after how many restarts."""
    rank, failure = exc.get_first_failure()  # the root cause: the first to fail, not a peer it took down
    code = failure.exitcode
    why = _reason_text(error_dir, rank) or "it left without a Python error (killed, or an abrupt exit)"
    return (
        f"the job failed {max_restarts + 1} times (--max-restarts {max_restarts}); the last time rank {rank} failed "
        f"(exit code {code}): {why}; stopped all ranks{'; ' + hint if hint else ''}."
    )
