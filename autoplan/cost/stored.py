"""The search cache: what the pipeline schedules' analyses computed, kept on disk for the next plan (docs/ilp.md,
"The search cache").

A search on many devices replays hundreds of pipeline schedules (cost/pp/: each rank's order, its states' floors,
its receive slots, its re-runs, the peak state of a stage's bytes): pure functions of their arguments (schedule,
pp, v, m, rank, and a few byte or second weights) and of autoplan's code, memoised in each process with
``lru_cache``. :func:`stored` is that lru_cache, over a second memo: while a folder is attached
(:func:`attached`, around the search of ``autoplan plan`` and ``sweep``), a call whose arguments the folder's file
holds returns the stored value instead of computing it, and the values computed are added to the file when the
search ends. A later plan of the same or another model on the same schedules reads them back: the same values, so
the same plans and prices (tests/unit/cost/test_stored.py), without the work (GPT-1T on 3,072 A100s: ~20% of the
search's CPU). The share processes of a search (solve/shares.py) send theirs back to the parent with their rows.

The file is ``<folder>/<digest>.pickle``, the digest that of autoplan's version, of the code of cost/ and types/ (a
changed cost model never reads old values), of numpy's version and of the CPU (:func:`code_digest`); only builtins'
values and autoplan's named tuples are read from it. It is written atomically (a temporary file renamed over it); one
that cannot be read is ignored and written again, one that cannot be written is a note for the command to print; past
:data:`MAX_FILE_BYTES` it starts again from this search's values, and the folder keeps its :data:`KEPT_FILES` last
written files. Location: ``$AUTOPLAN_SEARCH_CACHE`` (a folder, or ``off``), else ``$XDG_CACHE_HOME/autoplan/search``,
else ``~/.cache/autoplan/search``. Nothing is stored while no folder is attached (the API, the tests).
"""

from __future__ import annotations

import contextlib
import functools
import gc
import hashlib
import io
import os
import pickle
import platform
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

from autoplan.types._check import write_bytes_atomic
from autoplan.version import __version__

ENV_VAR = "AUTOPLAN_SEARCH_CACHE"
OFF = ("off", "0", "no", "false")
MAX_FILE_BYTES = 32 << 20  # a file past this starts again: its load would cost more than most searches save
KEPT_FILES = 4  # the folder's files kept, the last written: a few versions or machines sharing one home folder
_CODE = ("cost", "types")  # autoplan's folders whose code the stored functions' values are a function of
_MISSING = object()


class _Store:
    """The attached file's values (read at the first call that misses its lru_cache) and those computed since."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.read: dict[str, dict] | None = None  # by function, once loaded
        self.fresh: dict[str, dict] = {}  # by function: computed in this process since attached (or forked)
        self.notes: list[str] = []

    def values(self, name: str) -> dict:
        if self.read is None:
            self.read = _load(self.path) if self.path is not None else {}
        return self.read.get(name, {})


_store = _Store(None)
_MEMOS: list = []  # every stored function's lru_cache


def stored(maxsize: int | None = None) -> Callable[[Callable], Callable]:
    """``functools.lru_cache(maxsize)`` of ``fn`` (a pure function of hashable arguments) over a lookup in the attached
    file (module docstring): each of its misses reads the file's value or computes it and keeps it to save; with none
    attached, ``fn``'s lru_cache, but for one test a miss."""

    def decorate(fn: Callable) -> Callable:
        name = f"{fn.__module__}.{fn.__qualname__}"

        @functools.wraps(fn)
        def lookup(*args: Any, **kwargs: Any) -> Any:
            if _store.path is None:
                return fn(*args, **kwargs)
            key = (args, tuple(sorted(kwargs.items())))
            value = _store.values(name).get(key, _MISSING)
            if value is _MISSING:
                value = fn(*args, **kwargs)
                _store.fresh.setdefault(name, {})[key] = value
            return value

        memo = functools.lru_cache(maxsize=maxsize)(lookup)
        _MEMOS.append(memo)
        return memo

    return decorate


def clear_memos() -> None:
    """Empty every :func:`stored` function's lru_cache (the values in this process), as a new process starts."""
    for memo in _MEMOS:
        memo.cache_clear()


def cache_dir() -> Path | None:
    """The folder the command line attaches (module docstring), or None when switched off."""
    setting = os.environ.get(ENV_VAR, "")
    if setting.lower() in OFF:
        return None
    if setting:
        return Path(setting)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "autoplan" / "search"


@contextlib.contextmanager
def attached(folder: Path | None) -> Iterator[list[str]]:
    """The search inside reads and adds to ``folder``'s file (None: nothing stored); yields the notes (one sentence
    each: a file that could not be written) filled in as it ends, when the values computed inside are saved."""
    global _store
    previous, _store = _store, _Store(folder / f"{code_digest()}.pickle" if folder is not None else None)
    notes = _store.notes
    try:
        yield notes
    finally:
        store, _store = _store, previous
        if store.path is not None and store.fresh:
            _save(store)


def forked() -> None:
    """In a share's child process: count as computed only what this process computes from here on."""
    _store.fresh = {}


def computed() -> dict[str, dict]:
    """The values this process computed since it was attached or forked, for a share's child to send its parent."""
    return _store.fresh if _store.path is not None else {}


def add_computed(values: dict[str, dict]) -> None:
    """Add a share's child's :func:`computed` values to what this process saves."""
    for name, entries in values.items():
        _store.fresh.setdefault(name, {}).update(entries)


def code_digest() -> str:
    """The first 16 hex digits of the SHA-256 of autoplan's version, the code of cost/ and types/, and what else a
    value may read: numpy's version and the machine's CPU (a peak state is an argmax of numpy's float products, whose
    last bits its kernels for a CPU may round otherwise; a home folder may be shared by machines)."""
    root = Path(__file__).resolve().parent.parent
    digest = hashlib.sha256(f"{__version__} numpy {np.__version__} {platform.machine()} {_cpu_model()}".encode())
    for file in sorted(p for folder in _CODE for p in (root / folder).rglob("*.py")):
        digest.update(str(file.relative_to(root)).encode() + b"\0" + file.read_bytes())
    return digest.hexdigest()[:16]


def _cpu_model() -> str:
    """The CPU's model name where the system says it (Linux), else the platform's processor string."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    return platform.processor()


class _OwnClasses(pickle.Unpickler):
    """Reads builtins' values and autoplan's named tuples only (RankFloors): anything else in the file, a function
    or another class whose call the file could ask for, is a corrupt file."""

    def find_class(self, module: str, name: str) -> Any:
        found = super().find_class(module, name) if module.split(".")[0] == "autoplan" else None
        if not (isinstance(found, type) and issubclass(found, tuple)):
            raise pickle.UnpicklingError(f"{module}.{name} is not one of autoplan's named tuples")
        return found


def _load(path: Path) -> dict[str, dict]:
    """The file's values by function; none where it is missing, unreadable or not the store's."""
    try:
        data = _OwnClasses(io.BytesIO(path.read_bytes())).load()
    except Exception:  # noqa: BLE001 - missing, corrupt or foreign: a cache, computed again and written over
        return {}
    return data if isinstance(data, dict) and all(isinstance(v, dict) for v in data.values()) else {}


def _save(store: _Store) -> None:
    """Add ``store``'s computed values to its file (as it is now: another process may have added to it), atomically;
    past MAX_FILE_BYTES, this search's values alone. The cyclic collector is paused meanwhile (reading the file makes
    ~10^5 tuples that live on: 0.24 -> 0.05 s for GPT-1T's 3.7 MB). A cache never fails the plan: what goes wrong
    here is a note."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        merged = _load(store.path)
        for name, entries in store.fresh.items():
            merged.setdefault(name, {}).update(entries)
        data = pickle.dumps(merged, protocol=pickle.HIGHEST_PROTOCOL)
        if len(data) > MAX_FILE_BYTES:
            data = pickle.dumps(store.fresh, protocol=pickle.HIGHEST_PROTOCOL)
        write_bytes_atomic(store.path, data)
        _forget_old(store.path.parent)
    except Exception as exc:  # noqa: BLE001 - a file system's refusal, or a value that would not pickle
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        store.notes.append(f"the search cache '{store.path.parent}' could not be written ({why}).")
    finally:
        if collecting:
            gc.enable()


def _forget_old(folder: Path) -> None:
    """Remove the folder's files but the :data:`KEPT_FILES` last written: those of older code (or another
    machine's) are read no more, and a folder kept for years would otherwise hold one for each release."""
    written = {}
    for file in folder.glob("*.pickle"):
        with contextlib.suppress(FileNotFoundError):  # another process's may go meanwhile
            written[file] = file.stat().st_mtime
    for old in sorted(written, key=written.__getitem__, reverse=True)[KEPT_FILES:]:
        old.unlink(missing_ok=True)
