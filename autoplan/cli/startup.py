"""Start-up cost of a command: import torch and the planner without Python's full collections.

Importing torch (and ``torch._dynamo`` where a trace needs it: cli/dynamo_stand_in.py) creates about a million
long-lived objects and almost no garbage, and CPython runs a full (generation-2) collection each
time the long-lived heap grows by a quarter: five rescans of everything, about 0.4 s of a 3 s
``autoplan plan`` on the 2-core dev machine, for a few hundred objects freed. :func:`frozen_imports`
imports with the cyclic collector paused, then freezes the heap (``gc.freeze``: later collections
skip those objects) for the rest of the command, and unfreezes it afterwards, so a test process
that calls the CLI keeps collecting as before.

The command itself allocates the same way: tracing, searching and writing a 671B MoE model
(examples/hf_deepseek_v3.py on 2,048 GPUs) keeps a ten-thousand-node graph, its FX graph and
thousands of priced plans alive to the end, and CPython's default thresholds (700, 10, 10) ran
about 1,400 young and 9 full collections over them (1.4 s). Inside the block the young
generation is collected every :data:`YOUNG_THRESHOLD` allocations instead (0.3 s, about 25 MB
more peak memory); the thresholds are restored on the way out.

A plan whose trace is in the trace cache (autoplan/trace/cache.py) needs no torch at all: the
commands import it, with :func:`paused_imports`, only when they trace (cli/trace.py, ``model_graph``).

Leaving costs too: the interpreter's finalisation clears every module and frees torch's objects one
by one (0.16 s of user CPU after the 4-layer GPT's traced plan). :func:`exit_now` flushes the standard
streams, runs the exit handlers (``atexit``) and leaves with ``os._exit``, as a rank does
(execute/job/runner.py); docs/cli.md, "Start-up".
"""

from __future__ import annotations

import atexit
import gc
import importlib
import os
import sys
import threading
from contextlib import contextmanager
from typing import Iterator

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
    enabled = gc.isenabled()
    gc.disable()
    try:
        for name in modules:
            importlib.import_module(name)
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
