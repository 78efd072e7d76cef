"""Ranks never outlive the `autoplan run` that launched them.

The launcher (autoplan/jobs/launcher.py) puts its pid in ``AUTOPLAN_LAUNCHER_PID``. A rank
that finds it asks the kernel for SIGTERM when its parent dies (Linux ``prctl(PR_SET_PDEATHSIG)``,
which holds across the launcher being killed with SIGKILL), then checks that the launcher is
still its parent (it may have died before the request). Where prctl is missing (macOS), a
daemon thread polls the parent pid once a second instead. Under torchrun (``TORCHELASTIC_RUN_ID``
set, no launcher pid) the parent is torchrun's agent, which handles stop signals itself, but a
node whose agent is killed with SIGKILL (a node lost) must not leave its ranks training with the
survivors, so the rank ties itself to the agent, its parent, the same way.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import sys
import threading
import time

LAUNCHER_PID_ENV = "AUTOPLAN_LAUNCHER_PID"
PR_SET_PDEATHSIG = 1
POLL_S = 1.0


def die_with_launcher() -> None:
    """Arrange for this rank to end when its launcher (or torchrun agent) does (module docstring)."""
    launcher = os.environ.get(LAUNCHER_PID_ENV)
    if launcher and launcher.isdigit():
        launcher_pid = int(launcher)
    elif os.environ.get("TORCHELASTIC_RUN_ID"):
        launcher_pid = os.getppid()  # torchrun's agent
    else:
        return
    if not _request_parent_death_signal():
        threading.Thread(target=_watch_parent, args=(launcher_pid,), daemon=True, name="autoplan-lifeline").start()
    if os.getppid() != launcher_pid:  # the launcher died before the request took effect
        _leave()


def _request_parent_death_signal() -> bool:
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        return libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _watch_parent(launcher_pid: int) -> None:
    while os.getppid() == launcher_pid:
        time.sleep(POLL_S)
    _leave()


def _leave() -> None:
    os.kill(os.getpid(), signal.SIGTERM)
