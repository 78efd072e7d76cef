"""Would the whole model fail where the model cut to its first blocks failed? (docs/trace.md,
"Failing fast"). When the export of the first ``kept`` blocks (trace/stitch.py) fails, the full
export is skipped, and the model refused at once, when nothing in the model can tell the two apart:

1. the model's own code never looked at the cut container except to iterate it (no ``len``, no
   index, no ``named_modules`` or ``parameters`` from the model's code): the blocks it did not run
   are the only difference between the two runs; and
2. the failure came before the last kept block finished (then the full run reaches the same op
   with the same inputs), or that block hands on what it received (its first tensor output has its
   first tensor input's shape and dtype, so every alike block after it does too, and the code
   after the blocks sees what it saw here).

Else the full export runs, as before. The watch is a dict subclass put in place of the container's
``_modules`` (the cut itself) that notes the callers in the model's code (torch's own walks over
the modules, the exporter's, are not), and a hook on the last kept block.
"""

from __future__ import annotations

import contextlib
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import torch
import torch.nn as nn
from torch.utils._pytree import tree_leaves

_TORCH_DIR = str(Path(torch.__file__).parent)
_AUTOPLAN_DIR = str(Path(__file__).parent.parent)
_STDLIB_DIR = sysconfig.get_paths()["stdlib"]
_PACKAGES_DIRS = (sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"])


@dataclass
class CutWatch:
    """What the model showed of the cut while the cut model ran."""

    observed: bool = False  # its own code asked the container more than to iterate it
    finished: bool = False  # the last kept block returned
    fixed_point: bool = False  # ... handing on its first input's shape and dtype

    def same_failure(self) -> bool:
        """Whether the full model fails where the cut one did (module docstring)."""
        return not self.observed and (not self.finished or self.fixed_point)


class _WatchedModules(dict):
    """The kept blocks, noting any use by the model's own code but iteration (``values()``)."""

    watch: CutWatch

    def _note(self) -> None:
        if _called_by_model():
            self.watch.observed = True

    def __len__(self) -> int:
        self._note()
        return super().__len__()

    def __getitem__(self, key: str) -> nn.Module:
        self._note()
        return super().__getitem__(key)

    def __iter__(self) -> Iterator[str]:
        self._note()
        return super().__iter__()

    def keys(self):
        self._note()
        return super().keys()

    def items(self):
        self._note()
        return super().items()


def _called_by_model() -> bool:
    """Whether the model's code asked: the first caller outside torch, the standard library and
    this file, when torch runs further out (it called the model's forward). A caller with no torch
    further out before autoplan (a wrapper around the exporter) is not the model, nor is autoplan."""
    frame = sys._getframe(1)
    while frame is not None and _plumbing(frame.f_code.co_filename):
        frame = frame.f_back
    if frame is None or frame.f_code.co_filename.startswith((_AUTOPLAN_DIR, "<")):
        return False
    outer = frame.f_back
    while outer is not None and not outer.f_code.co_filename.startswith(_AUTOPLAN_DIR):
        if outer.f_code.co_filename.startswith(_TORCH_DIR):
            return True
        outer = outer.f_back
    return False


def _plumbing(filename: str) -> bool:
    """This file, torch, and Python's standard library (contextlib, functools), not its site-packages."""
    if filename == __file__ or filename.startswith(_TORCH_DIR):
        return True
    return filename.startswith(_STDLIB_DIR) and not filename.startswith(_PACKAGES_DIRS)


@contextlib.contextmanager
def watched_cut(model: nn.Module, name: str, kept: int) -> Iterator[CutWatch]:
    """Within the block, the container at ``name`` holds only its first ``kept`` blocks, watched."""
    container = model.get_submodule(name)
    saved = container._modules
    watch = CutWatch()
    modules = _WatchedModules((key, saved[key]) for key in list(saved)[:kept])
    modules.watch = watch
    last = saved[list(saved)[kept - 1]]
    handles = [last.register_forward_hook(lambda m, args, out: _finished(watch, args, out))]
    container._modules = modules
    try:
        yield watch
    finally:
        container._modules = saved
        for handle in handles:
            handle.remove()


def _finished(watch: CutWatch, args: Any, out: Any) -> None:
    watch.finished = True
    first_in = next((t for t in tree_leaves(args) if isinstance(t, torch.Tensor)), None)
    first_out = next((t for t in tree_leaves(out) if isinstance(t, torch.Tensor)), None)
    watch.fixed_point = (
        first_in is not None
        and first_out is not None
        and tuple(first_in.shape) == tuple(first_out.shape)
        and first_in.dtype == first_out.dtype
    )
