"""A cache of traces on disk: a model file traced once, its Graph reused by later plans
(docs/trace.md, "The trace cache": what the key holds, where it lives, and the timings).

An entry is keyed on what the trace is a function of. The *base key* is the SHA-256 of the
model file's path and bytes, the batch size, the routing model, the installed torch version and
a digest of autoplan's own tracer (``__version__`` and the bytes of trace/, types/ and
modelfile.py, so a changed tracer never reuses an old graph). What the trace read besides is
recorded while it runs: every module loaded from the model file's folder (by the SHA-256 of its
bytes) and every environment variable code in that folder looked up (sizes such as
AUTOPLAN_GPTM_N_LAYER; trace/cache_reads.py). The index ``<base>.json`` lists those names; the
entry ``<base>-<reads>.json`` holds their values, ``<base>-<reads>.graph.json`` the graph (graph.json's text,
which ``plan`` then writes as it is: Graph.json_text), and is used only when every file
and variable it lists still has the value it stores (a variable as the SHA-256 of its value, None
when unset: the environment may hold secrets). Code that iterates the whole environment keys its
entry on all of it.

Entries are written atomically (a temporary file renamed over the name); one that cannot be read
is reported in a warning and traced again. Location: ``$AUTOPLAN_TRACE_CACHE`` (a folder, or
``off``), else ``$XDG_CACHE_HOME/autoplan/traces``, else ``~/.cache/autoplan/traces``.
Nothing here imports torch: a hit plans without it.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any, Callable

from autoplan.trace.cache_reads import Reads, recording
from autoplan.types._check import write_json_atomic, write_text_atomic
from autoplan.types.graph import Graph
from autoplan.types.moe import RoutingModel
from autoplan.version import __version__

ENV_VAR = "AUTOPLAN_TRACE_CACHE"
OFF = ("off", "0", "no", "false")
CACHE_FORMAT = 2  # bump when an entry's layout changes
_TRACER_SOURCES = ("trace", "types")  # autoplan's folders whose code decides a graph (with modelfile.py)


@dataclass
class Traced:
    """A model file's graph, whether the cache held it, and what went wrong with the cache (one
    sentence each: a corrupt entry, a folder that cannot be written), for the command to print."""

    graph: Graph
    hit: bool
    warnings: list[str] = field(default_factory=list)


def cache_dir(*, enabled: bool = True) -> Path | None:
    """The cache folder (module docstring), or None when the cache is switched off."""
    setting = os.environ.get(ENV_VAR, "")
    if not enabled or setting.lower() in OFF:
        return None
    if setting:
        return Path(setting)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "autoplan" / "traces"


def cached_trace(
    path: str | Path,
    batch_size: int,
    *,
    routing: RoutingModel | None,
    trace: Callable[[], Graph],
    folder: Path | None,
    prepare: Callable[[], None] = lambda: None,
) -> Traced:
    """The entry for this trace if one is still valid, else ``trace()`` run while its reads are
    recorded, and stored. ``prepare()`` runs first on a miss, outside the recording (imports:
    a library that keeps ``os.environ`` at import must keep the real one)."""
    if folder is None:
        prepare()
        return Traced(trace(), hit=False)
    model = Path(path).resolve()
    base = base_key(model, batch_size, routing)
    notes: list[str] = []
    graph = _lookup(folder, base, notes)
    if graph is not None:
        return Traced(graph, hit=True)
    prepare()
    with recording(model.parent) as reads:
        graph = trace()
    _store(folder, base, reads, graph, notes)
    return Traced(graph, hit=False, warnings=notes)


def base_key(model: Path, batch_size: int, routing: RoutingModel | None) -> str:
    """The SHA-256 of what every trace of this file is a function of (module docstring)."""
    if not model.is_file():
        return ""  # the trace itself says the file is missing
    parts = {
        "format": CACHE_FORMAT,
        "model": str(model),
        "model_sha256": _file_sha256(model),
        "batch_size": batch_size,
        "routing": (routing or RoutingModel()).to_dict(),
        "torch": _torch_version(),
        "autoplan": tracer_digest(),
        "python": list(sys.version_info[:2]),
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


def tracer_digest() -> str:
    """autoplan's version and the SHA-256 of the tracer's own source files."""
    root = Path(__file__).resolve().parent.parent
    digest = hashlib.sha256(__version__.encode())
    files = sorted(p for name in _TRACER_SOURCES for p in (root / name).rglob("*.py"))
    for file in [*files, root / "modelfile.py"]:
        digest.update(str(file.relative_to(root)).encode() + b"\0" + file.read_bytes())
    return digest.hexdigest()


def _torch_version() -> str:
    try:
        return metadata.version("torch")
    except metadata.PackageNotFoundError:  # a source build: the version is only known by importing it
        import torch

        return torch.__version__


def _file_sha256(path: Path) -> str | None:
    try:
        return _sha256(path.read_bytes())
    except OSError:
        return None


def _current(names: dict[str, list[str]]) -> dict[str, dict[str, Any]]:
    """The present value of each recorded read: files by SHA-256, variables by value."""
    everything = names.get("all_env", False)
    env = dict(os.environ) if everything else {name: os.environ.get(name) for name in names["env"]}
    digests = {name: None if value is None else _sha256(value.encode()) for name, value in env.items()}
    return {"files": {f: _file_sha256(Path(f)) for f in names["files"]}, "env": digests}


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _reads_key(base: str, values: dict[str, Any]) -> str:
    return f"{base}-{hashlib.sha256(json.dumps(values, sort_keys=True).encode()).hexdigest()[:32]}"


def _lookup(folder: Path, base: str, notes: list[str]) -> Graph | None:
    index = folder / f"{base}.json"
    if not base or not index.is_file():
        return None
    try:
        names = json.loads(index.read_text())
        values = _current(names)
        entry_path = folder / f"{_reads_key(base, values)}.json"
        if not entry_path.is_file():
            return None
        entry = json.loads(entry_path.read_text())
        if entry["reads"] != values:
            return None
        return Graph.from_json_text(_graph_file(entry_path).read_text())
    except Exception as exc:  # a corrupt or foreign file must never stop a plan: trace again
        why = type(exc).__name__
        notes.append(f"ignoring a trace cache entry in {folder} that cannot be read ({why}); traced again.")
        return None


def _store(folder: Path, base: str, reads: Reads, graph: Graph, notes: list[str]) -> None:
    """Write the index (the union of the names any trace of this base read) and the entry."""
    if not base:
        return
    index = folder / f"{base}.json"
    names = reads.names()
    try:
        old = json.loads(index.read_text()) if index.is_file() else {}
        names = {
            "files": sorted(set(names["files"]) | set(old.get("files", []))),
            "env": sorted(set(names["env"]) | set(old.get("env", []))),
            "all_env": names["all_env"] or old.get("all_env", False),
        }
    except (OSError, ValueError, TypeError, AttributeError):
        pass  # an unreadable index is replaced
    values = _current(names)
    try:
        entry = folder / f"{_reads_key(base, values)}.json"
        write_text_atomic(_graph_file(entry), graph.json_text())  # before the entry that names it
        write_json_atomic(entry, {"reads": values})
        write_json_atomic(index, names)
    except OSError as exc:  # a read-only or full disk costs the next plan a trace, nothing more
        why = exc.strerror or exc
        notes.append(f"could not write the trace cache in {folder} ({why}); the next plan traces again.")


def _graph_file(entry: Path) -> Path:
    """Where the graph of ``entry`` is kept: beside it, as graph.json's text."""
    return entry.with_name(f"{entry.stem}.graph.json")
