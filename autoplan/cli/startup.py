"""Start-up cost of a command: import torch and the planner without Python's full collections.

Importing torch (and ``torch._dynamo`` where a trace needs it: cli/dynamo_stand_in.py) creates about a million
long-lived objects and almost no garbage, and CPython runs a full (generation-2) collection each
time the long-lived heap grows by a quarter: five rescans of everything, about 0.4 s of a 3 s
``autoplan plan`` on the 2-core dev machine, for a few hundred objects freed. :func:`frozen_imports`
imports with the cyclic collector paused, then freezes the heap (``gc.freeze``: later collections skip
those objects) for the rest of the command, and unfreezes it afterwards (a test calling the CLI collects as before).

The command itself allocates the same way: tracing, searching and writing a 671B MoE model
(examples/hf_deepseek_v3.py on 2,048 GPUs) keeps a ten-thousand-node graph, its FX graph and
thousands of priced plans alive to the end, and CPython's default thresholds (700, 10, 10) ran
about 1,400 young and 9 full collections over them (1.4 s). Inside the block the young
generation is collected every :data:`YOUNG_THRESHOLD` allocations instead (0.3 s, about 25 MB
more peak memory); the thresholds are restored on the way out.

A plan whose trace is cached (trace/cache.py) needs no torch: it comes, with :func:`paused_imports`, only to trace
(cli/trace.py), the model file's imports with :func:`paused`; the heap is frozen after the trace, whose graphs live on,
and after the search, run paused too (cli/solve.py): its collections freed no measurable memory on GPT-1T or
DeepSeek-V3 and cost 0.6 s and 1.0 s of user CPU.

Leaving costs too: the interpreter's finalisation clears every module and frees torch's objects one by one (0.16 s
of user CPU after the 4-layer GPT's traced plan). :func:`exit_now` flushes the standard streams, runs the exit
handlers (``atexit``) and leaves with ``os._exit``, as a rank does (execute/job/runner.py); docs/cli.md, "Start-up".
"""

from __future__ import annotations

import atexit
import gc
import importlib
import os
import sys
import threading
from contextlib import contextmanager
from typing import Any, Callable, Iterator, TypeVar

T = TypeVar("T")

#: Net allocations between young-generation collections while a command runs (CPython's default: 700).
YOUNG_THRESHOLD = 10_000


@contextmanager
def frozen_imports(*modules: str) -> Iterator[None]:
    """Import ``modules`` with the cyclic GC paused; keep the heap frozen, and young collections
    rarer (module docstring), inside the block."""
    thresholds = gc.get_threshold()
    paused_imports(*modules)
    gc.set_threshold(max(YOUNG_THRESHOLD, thresholds[0]), *thresholds[1:])
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)
        gc.unfreeze()


def paused_imports(*modules: str) -> None:
    """Import ``modules`` with the cyclic GC paused, then freeze the heap (module docstring); inside
    :func:`frozen_imports` the heap is unfrozen on its way out."""
    with paused_collector():
        for name in modules:
            importlib.import_module(name)


def paused(fn: Callable[..., T]) -> Callable[..., T]:
    """``fn`` run with the cyclic GC paused and the heap frozen after it (a model file's import)."""

    def run(*args: Any, **kwargs: Any) -> T:
        with paused_collector():
            return fn(*args, **kwargs)

    return run


@contextmanager
def paused_collector() -> Iterator[None]:
    """The cyclic GC paused inside the block, and the heap frozen once it has run without an error
    (module docstring); the collector is left enabled or not as it was."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
        gc.freeze()
    finally:
        if enabled:
            gc.enable()


def exit_now(code: int) -> None:
    """Leave the program with ``code`` without the interpreter's finalisation (module docstring),
    once the exit handlers have run; with another thread still running, return and let the
    interpreter join it as usual."""
    if threading.active_count() > 1:
        return
    _flush()
    atexit._run_exitfuncs()
    _flush()
    os._exit(code)


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed stream or a reader gone (| head): nothing left to say
            pass
