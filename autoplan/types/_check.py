"""Small validation helpers shared by the data types.

Each check raises the type's own error with one sentence naming the field, the value and
what was expected, as torchtitan's ParallelDims does for its degrees.
"""

from __future__ import annotations

import json
import os
import secrets
import stat
from pathlib import Path
from typing import Any


def require(condition: bool, error: type[Exception], message: str) -> None:
    """Raise ``error(message)`` unless ``condition`` holds."""
    if not condition:
        raise error(message)


def require_fields(data: Any, fields: tuple[str, ...], error: type[Exception], what: str) -> None:
    """Check that a loaded mapping has every required key, naming the first missing one."""
    require(isinstance(data, dict), error, f"{what} must be a mapping, got {type(data).__name__}.")
    for name in fields:
        require(name in data, error, f"{what} is missing the field '{name}'.")


def require_known_fields(data: dict[str, Any], cls: type, error: type[Exception], what: str) -> None:
    """Check that a loaded mapping has no key the dataclass ``cls`` lacks, naming the first one."""
    known = set(cls.__dataclass_fields__)
    unknown = sorted(set(data) - known)
    first = unknown[0] if unknown else ""
    require(not unknown, error, f"{what} has unknown field '{first}'; expected only {', '.join(sorted(known))}.")


def temp_file_beside(path: Path, suffix: str = ".tmp") -> tuple[int, str]:
    """Open a new, uniquely named file in ``path``'s folder for writing; return ``(fd, name)``.

    Created as ``open()`` creates a file (mode 0o666 less the process umask: 0644 under umask
    022), not 0600 as ``tempfile.mkstemp`` does, so the file renamed over ``path`` has the
    permissions a plain write would give it. When ``path`` exists its mode is kept, as a plain
    write into an existing file keeps it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
    for _ in range(100):
        name = str(path.parent / f".{path.name}.{secrets.token_hex(6)}{suffix}")
        try:
            fd = os.open(name, flags, 0o666)
        except FileExistsError:
            continue
        if path.exists():
            os.chmod(name, stat.S_IMODE(path.stat().st_mode))
        return fd, name
    raise FileExistsError(f"no free temporary name beside '{path}'")


def write_text_atomic(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` to ``path`` through a temporary file and a rename, so a crash never
    leaves a half-written file where the user's last good one was (:func:`temp_file_beside`)."""
    return _write_atomic(path, text, "w")


def write_bytes_atomic(path: str | os.PathLike, data: bytes) -> Path:
    """:func:`write_text_atomic` of bytes."""
    return _write_atomic(path, data, "wb")


def _write_atomic(path: str | os.PathLike, content: str | bytes, mode: str) -> Path:
    path = Path(path)
    fd, tmp = temp_file_beside(path)
    try:
        with os.fdopen(fd, mode) as handle:
            handle.write(content)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def write_json_atomic(path: str | os.PathLike, data: Any) -> Path:
    """Write ``data`` as indented JSON, atomically."""
    return write_text_atomic(path, json_file_text(data))


def json_file_text(data: Any) -> str:
    """The text :func:`write_json_atomic` writes: ``data`` as JSON indented by 2, and a newline."""
    return json.dumps(data, indent=2, sort_keys=False) + "\n"


def read_json(path: str | os.PathLike, error: type[Exception], what: str) -> Any:
    """Read a JSON file, turning a missing file or bad JSON into one clear sentence."""
    path = Path(path)
    require(path.is_file(), error, f"{what} file '{path}' does not exist.")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise error(f"{what} file '{path}' is not valid JSON ({exc.msg} at line {exc.lineno}).") from None
