"""Start-up cost of a command: import torch and the planner without Python's full collections.

Importing torch (with ``torch._dynamo``, which FakeTensorMode loads) creates about a million
long-lived objects and almost no garbage, and CPython runs a full (generation-2) collection each
time the long-lived heap grows by a quarter: five rescans of everything, about 0.4 s of a 3 s
``autoplan plan`` on the 2-core dev machine, for a few hundred objects freed. :func:`frozen_imports`
imports with the cyclic collector paused, then freezes the heap (``gc.freeze``: later collections
skip those objects) for the rest of the command, and unfreezes it afterwards, so a test process
that calls the CLI keeps collecting as before.
"""

from __future__ import annotations

import gc
import importlib
from contextlib import contextmanager
from typing import Iterator


@contextmanager
def frozen_imports(*modules: str) -> Iterator[None]:
    """Import ``modules`` with the cyclic GC paused; keep the heap frozen inside the block."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        for name in modules:
            importlib.import_module(name)
        gc.freeze()
    finally:
        if enabled:
            gc.enable()
    try:
        yield
    finally:
        gc.unfreeze()
