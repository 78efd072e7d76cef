"""Environment variables set for a while and restored afterwards (a launch's rendezvous settings,
a re-trace under the run's environment)."""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from contextlib import contextmanager


@contextmanager
def environment(pairs: Iterable[tuple[str, str]]) -> Iterator[None]:
    """Set ``pairs`` in ``os.environ`` inside the block, restoring each variable's old value (or its
    absence) after, whatever the block raises."""
    pairs = tuple(pairs)
    saved = {key: os.environ.get(key) for key, _ in pairs}
    os.environ.update(dict(pairs))
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
