"""What a trace read besides the model file (trace/cache.py, module docstring): the modules it
loaded from the model's folder and the environment variables its code looked up.

While :func:`recording` runs, ``os.environ`` is a :class:`_Recorder` that answers from the real
environment and notes each name that code in the model's folder looks up (``os.environ[name]``,
``.get``, ``in``, ``os.getenv``; torch's own lookups of its settings are not the model's);
iterating it there (``.items()``, ``.copy()``) notes that the whole environment was read. The
real mapping is put back on the way out. The modules are those in ``sys.modules``
afterwards whose file lies in the model's folder or below it.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import MutableMapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

_PLUMBING = frozenset({os.__file__, MutableMapping.get.__code__.co_filename, __file__})


def _within(filename: str, folder: Path) -> bool:
    return not filename.startswith("<") and Path(filename).resolve().is_relative_to(folder)


@dataclass
class Reads:
    """The names a trace read: filled by :func:`recording`."""

    folder: Path
    env: set[str] = field(default_factory=set)
    all_env: bool = False
    files: list[str] = field(default_factory=list)

    def names(self) -> dict[str, Any]:
        return {"files": sorted(self.files), "env": sorted(self.env), "all_env": self.all_env}


class _Recorder(MutableMapping):
    """``os.environ`` for the length of a trace: the real mapping, with each read noted."""

    def __init__(self, real: MutableMapping, reads: Reads) -> None:
        self._real, self._reads = real, reads

    def __getitem__(self, name: str) -> str:
        if self._by_model():
            self._reads.env.add(name)
        return self._real[name]

    def __setitem__(self, name: str, value: str) -> None:
        self._real[name] = value

    def __delitem__(self, name: str) -> None:
        del self._real[name]

    def __iter__(self) -> Iterator[str]:
        self._reads.all_env = self._reads.all_env or self._by_model()
        return iter(self._real)

    def __len__(self) -> int:
        return len(self._real)

    def copy(self) -> dict[str, str]:
        self._reads.all_env = self._reads.all_env or self._by_model()
        return dict(self._real)

    def _by_model(self) -> bool:
        """Whether the code asking is in the model's folder: the first caller outside os.py,
        the mapping's own methods and this file."""
        frame = sys._getframe(2)
        while frame is not None and frame.f_code.co_filename in _PLUMBING:
            frame = frame.f_back
        return frame is not None and _within(frame.f_code.co_filename, self._reads.folder)


@contextlib.contextmanager
def recording(folder: Path) -> Iterator[Reads]:
    """Note the environment variables read inside the block, and the modules from ``folder``
    loaded when it ends (module docstring)."""
    reads = Reads(folder=folder)
    real = os.environ
    os.environ = _Recorder(real, reads)
    try:
        yield reads
    finally:
        os.environ = real
    reads.files = _module_files(folder)


def _module_files(folder: Path) -> list[str]:
    files = set()
    for module in list(sys.modules.values()):
        name = getattr(module, "__file__", None)
        if not name:
            continue
        if _within(name, folder) and Path(name).is_file():
            files.add(str(Path(name).resolve()))
    return sorted(files)
