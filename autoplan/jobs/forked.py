"""A local rank forked from the launcher instead of started as a fresh interpreter.

``autoplan run``'s launcher has imported torch and the model file (with its libraries: transformers
alone is 2-3 s of CPU) to check the plan before any rank starts; a rank started as
``python -m autoplan.cli.rank`` imports them all again, once per rank. A rank forked from the
launcher starts with them imported and runs ``python -m MODULE ARGS``'s code (:func:`runpy.run_module`)
in the same environment a started rank gets (autoplan/jobs/launcher.py ``_env``).

Forking is only safe from a process that started no thread pool a child would inherit half of:
GNU OpenMP's pool (one parallel op with more than one intra-op thread starts it, and a forked child's
first parallel op then waits forever on threads that do not exist in it) or the CUDA driver (which a
forked child cannot use). The caller decides (:func:`autoplan.cli.execute`: the ``autoplan`` program's
own process, on CPU, with one intra-op thread from its start); the child resets the launcher's
stop-signal handlers, sends its stderr through a pipe as a started rank's, and leaves with ``os._exit``
so that nothing of the launcher (its ``finally`` blocks, its temporary folder, atexit) runs twice.

:class:`ForkedRank` answers what the launcher asks of a :class:`subprocess.Popen` (``poll``, ``wait``,
``terminate``, ``kill``, ``stderr``, ``pid``, ``returncode``).
"""

from __future__ import annotations

import os
import runpy
import signal
import subprocess
import sys
import time
import traceback

WAIT_POLL_S = 0.01


class ForkedRank:
    """One rank forked from this process: ``python -m module *args`` with ``env`` as its environment."""

    def __init__(self, *, module: str, args: list[str], env: dict[str, str]):
        sys.stdout.flush()  # what the launcher printed must not be printed again by the child
        sys.stderr.flush()
        read_fd, write_fd = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(read_fd)
            _run_child(module=module, args=args, env=env, stderr_fd=write_fd)
        os.close(write_fd)
        self.pid, self.returncode = pid, None
        self.stderr = os.fdopen(read_fd, "r", errors="replace")

    def poll(self) -> int | None:
        if self.returncode is None:
            done, status = os.waitpid(self.pid, os.WNOHANG)
            if done:
                self.returncode = os.waitstatus_to_exitcode(status)  # -N when killed by signal N, as Popen's
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(f"rank pid {self.pid}", timeout)
            time.sleep(WAIT_POLL_S)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:  # exited between the poll and the signal
                pass

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def _run_child(*, module: str, args: list[str], env: dict[str, str], stderr_fd: int) -> None:
    """In the forked child: become ``python -m module *args`` and never return."""
    code = 1
    try:
        os.dup2(stderr_fd, 2)
        os.close(stderr_fd)
        # a started process writes to its descriptors 1 and 2, whatever the launcher's sys.stdout was
        sys.stdout = open(1, "w", closefd=False, errors="backslashreplace")  # noqa: SIM115 - lives until _exit
        sys.stderr = open(2, "w", closefd=False, errors="backslashreplace", buffering=1)  # noqa: SIM115
        for sig in (signal.SIGTERM, signal.SIGHUP):  # the launcher's handlers raise StopSignal
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        os.environ.clear()
        os.environ.update(env)
        sys.argv = [module, *args]
        sys.modules.pop(module, None)  # run as __main__, not the copy the launcher imported
        runpy.run_module(module, run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as exc:
        code = _exit_code(exc.code)
    except BaseException:  # noqa: BLE001 - printed as a started rank's traceback, never raised into the launcher
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _exit_code(code: object) -> int:
    """``sys.exit(code)``'s process exit status: None is 0, an int itself, anything else printed and 1."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1
