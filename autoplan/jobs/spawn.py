"""N in-process workers that report back: the job layer's second way to start ranks.

``launcher.launch`` starts whole programs (``python -m MODULE``) and watches their exit codes.
A measurement needs something else: N ranks that run one Python function and send results
back. :func:`spawn_ranks` starts ``worker(rank, world, port, *args, messages)`` in N processes
forked from multiprocessing's fork server, which imported torch once (:data:`PRELOAD`; a spawned
process imported it again for every rank, 2 s of CPU each) and never ran an op, so a fork is as
clean as a fresh interpreter; each rank gets the caller's environment (the server's own is from
when it started), its sys.path and working directory; and :func:`collect` reads their messages:
``("tick", text)`` for progress, ``("done", rank, value)`` for a result, ``("error", rank,
traceback)`` for a failure; a worker's :func:`report` sends one of the last two. A deadline,
a rank that dies without reporting, or an error raises RunError in one sentence; the
processes are always joined or terminated (:func:`stop`), at once after a failure. The rendezvous port comes from
:func:`autoplan.jobs.launcher.free_port`.
"""

from __future__ import annotations

import os
import queue as queue_mod
import time
import traceback
from collections.abc import Callable
from typing import Any

import torch.multiprocessing as mp

from autoplan.errors import RunError
from autoplan.jobs.launcher import free_port

#: what the fork server imports once for every rank it forks (module docstring)
PRELOAD = ("torch", "torch.distributed")


def spawn_ranks(
    worker: Callable[..., None],
    *,
    processes: int,
    args: tuple,
    timeout_s: float,
    on_tick: Callable[[str], None] | None = None,
    what: str = "running",
) -> dict[int, Any]:
    """Run ``worker(rank, processes, port, *args, messages)`` on ``processes`` ranks; the value
    each rank reported, by rank."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(list(PRELOAD))  # taken when the server starts, at the first call of the process
    messages = ctx.Queue()
    port = free_port()
    environ = dict(os.environ)
    procs = [
        ctx.Process(target=_in_environ, args=(environ, worker, rank, processes, port, *args, messages), daemon=True)
        for rank in range(processes)
    ]
    for proc in procs:
        proc.start()
    try:
        values = collect(procs, messages, timeout_s=timeout_s, on_tick=on_tick, what=what)
    except BaseException:  # a rank failed, died or ran past the deadline: the others have nothing to finish
        stop(procs, join_s=0.0)
        raise
    stop(procs)
    return values


def _in_environ(environ: dict[str, str], worker: Callable[..., None], *args: Any) -> None:
    """A forked rank: ``worker(*args)`` in the caller's environment (module docstring)."""
    os.environ.clear()
    os.environ.update(environ)
    worker(*args)


def report(messages: Any, rank: int, work: Callable[[], Any]) -> None:
    """A worker's side of the protocol: run ``work`` and send its value, or its traceback, then
    leave the process group ``work`` may have joined, whichever way it ended."""
    import torch.distributed as dist

    try:
        messages.put(("done", rank, work()))
    except Exception:  # noqa: BLE001 - reported to the parent, which raises RunError
        messages.put(("error", rank, traceback.format_exc()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def collect(
    procs: list[Any], messages: Any, *, timeout_s: float, on_tick: Callable[[str], None] | None, what: str
) -> dict[int, Any]:
    """Each rank's reported value (module docstring), or RunError."""
    per_rank: dict[int, Any] = {}
    deadline = time.monotonic() + timeout_s
    while len(per_rank) < len(procs):
        if time.monotonic() > deadline:
            raise RunError(
                f"{what} did not finish in {timeout_s:.0f} s; rerun with a smaller sweep or a longer --timeout."
            )
        try:
            message = messages.get(timeout=1.0)
        except queue_mod.Empty:
            dead = [p for p in procs if p.exitcode not in (None, 0)]
            if dead:
                raise RunError(
                    f"a process exited with code {dead[0].exitcode} before reporting while {what}; rerun with --debug."
                ) from None
            continue
        if message[0] == "tick" and on_tick:
            on_tick(message[1])
        elif message[0] == "done":
            per_rank[message[1]] = message[2]
        elif message[0] == "error":
            raise RunError(f"rank {message[1]} failed while {what}: {message[2].strip().splitlines()[-1]}")
    return per_rank


def stop(procs: list[Any], *, join_s: float = 10.0) -> None:
    """Join every process, terminating those still alive after ``join_s`` (10 s after a job that
    reported: its ranks are leaving their process group; none after a failed one, whose other ranks
    may wait forever on the one that failed)."""
    for proc in procs:
        proc.join(timeout=join_s)
    for proc in procs:
        if proc.is_alive():
            proc.terminate()
            proc.join(timeout=5)
