"""Trace without importing torch._dynamo where nothing needs it (docs/cli.md, "Start-up").

Building a model on the meta device and running it on fake tensors calls functions that torch wraps
in ``torch._disable_dynamo`` (torch/_compile.py): on its first call, such a wrapper imports
torch._dynamo (0.6 s of user CPU on its own) only to ask
``torch._dynamo.disable(fn)`` for a copy of ``fn`` that the compiler will not trace into, and caches
it on ``fn``. No frame is being compiled while the planner traces, so ``fn`` itself behaves the same.

:func:`dynamo_deferred` puts a stand-in at ``sys.modules["torch._dynamo"]`` for the block: its
``disable(fn, wrapping=False)`` (torch/_compile.py's call) returns ``fn``; anything else asked of it
(an attribute, a submodule import: torch.export's fallback uses both; a model's own ``disable``)
imports the real torch._dynamo in its place first, which then serves the rest of the block. On the
way out the stand-in leaves ``sys.modules``, and every ``fn`` it passed through loses the cached
copy, so a later call wraps it with the real ``disable`` as before.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
from contextlib import contextmanager
from typing import Any, Callable, Iterator

from autoplan.types.graph import within

NAME = "torch._dynamo"
#: Its submodules that stand alone (a file of settings that imports nothing of torch._dynamo) and that
#: the trace reads: FakeTensorMode's constructor reads its fake-tensor cache settings in config
ALONE = frozenset({"torch._dynamo.config"})
CACHED = "__dynamo_disable"  # the attribute torch/_compile.py caches a wrapper's disabled copy in


class _StandIn(types.ModuleType):
    """torch._dynamo for torch's ``_disable_dynamo`` wrappers, until something needs more of it."""

    def __init__(self, spec: importlib.machinery.ModuleSpec) -> None:
        super().__init__(NAME)
        self.__file__ = spec.origin  # what inspect.getmodule asks every module while torch registers an op
        self.__path__ = list(spec.submodule_search_locations)  # a submodule import reaches _Swap first
        self.passed: list[Callable] = []

    def disable(self, fn: Callable | None = None, recursive: bool = True, **kwargs: Any) -> Any:
        if fn is None or kwargs.get("wrapping", True):  # not torch/_compile.py's call (wrapping=False): a
            return self.real().disable(fn, recursive, **kwargs)  # user's decorator gets the real one
        self.passed.append(fn)
        return fn

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):  # a module's own attributes (hasattr probes): a module may lack them
            raise AttributeError(name)
        return getattr(self.real(), name)

    def real(self) -> types.ModuleType:
        """The real torch._dynamo, imported in the stand-in's place."""
        if sys.modules.get(NAME) is self:
            del sys.modules[NAME]
        return importlib.import_module(NAME)


class _Swap(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Import the real torch._dynamo before any of its submodules; a submodule the real package
    already imported is returned as it is, not run again."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        stand_in = sys.modules.get(NAME)
        if not within(name, NAME) or name in ALONE or not isinstance(stand_in, _StandIn):
            return None  # ALONE: loaded from the real folder beneath the stand-in, then kept by the real one
        stand_in.real()
        return importlib.util.spec_from_loader(name, self) if name in sys.modules else None

    def create_module(self, spec: Any) -> types.ModuleType:
        return sys.modules[spec.name]

    def exec_module(self, module: types.ModuleType) -> None:
        pass


@contextmanager
def dynamo_deferred() -> Iterator[None]:
    """Run the block with the stand-in for torch._dynamo (module docstring); nothing changes where
    torch._dynamo is already imported."""
    if NAME in sys.modules:
        yield
        return
    stand_in = _StandIn(importlib.util.find_spec(NAME))
    swap = _Swap()
    sys.modules[NAME] = stand_in
    sys.meta_path.insert(0, swap)
    try:
        yield
    finally:
        sys.meta_path.remove(swap)
        if sys.modules.get(NAME) is stand_in:
            del sys.modules[NAME]
        for fn in stand_in.passed:
            if getattr(fn, "__dict__", {}).get(CACHED) is fn:
                delattr(fn, CACHED)
