"""Checkpoints on disk: layout, what each records, and the checks before anything loads.

Layout of a checkpoint directory ``D``::

    D/step-00000010/          one checkpoint: torch.distributed.checkpoint (DCP) files
        .metadata, __0_0.distcp, ...   (each rank writes its own shards)
        autoplan.json         written last, atomically: the step, the plan, the model's identity
    D/latest                  the name of the newest complete checkpoint, replaced atomically

A checkpoint counts only once its ``autoplan.json`` exists, so a job killed while writing
leaves the previous one as the newest. ``autoplan.json`` records the checkpoint format, the
autoplan version, the steps completed (the data position: batch ``k`` is drawn from seed
``seed + 1 + k``), the plan, the model file's path and SHA-256, the seed, the world size and the
measured rows so far.

Before a run loads one (:func:`check`), it is held against the model: a missing file, a DCP file
shorter than its metadata says (a copy cut short), a format from a newer autoplan, or a tensor
the model has that the checkpoint lacks or holds with another shape each give one sentence
(:class:`~autoplan.errors.CheckpointError`, exit 2) naming what was wrong.
"""

from __future__ import annotations

import hashlib
import re
import shutil
from dataclasses import MISSING, asdict, dataclass, field, fields
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from autoplan.errors import CheckpointError
from autoplan.types._check import read_json, write_json_atomic, write_text_atomic
from autoplan.version import __version__

FORMAT_VERSION = 1
INFO = "autoplan.json"
LATEST = "latest"
STEP_DIR = re.compile(r"^step-(\d{8})$")


def step_dir_name(step: int) -> str:
    return f"step-{step:08d}"


@dataclass
class CheckpointInfo:
    """What ``autoplan.json`` records beside the tensors (module docstring)."""

    step: int
    plan: dict[str, Any]
    model_file: str
    model_sha256: str
    seed: int
    world_size: int
    global_batch_size: int
    rows: list[dict[str, Any]] = field(default_factory=list)
    format_version: int = FORMAT_VERSION
    autoplan_version: str = __version__
    created_utc: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: Path) -> "CheckpointInfo":
        required = [f.name for f in fields(cls) if f.default is MISSING and f.default_factory is MISSING]
        missing = [name for name in required if name not in data]
        if missing:
            raise CheckpointError(
                f"checkpoint record '{where}' is incomplete (missing {', '.join(missing)}); it is corrupt."
            )
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


def model_sha256(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def model_shapes(model_file: Any) -> dict[str, tuple[int, ...]] | None:
    """``model.<fqn>`` -> shape of every parameter and persistent buffer of the model, built on
    the meta device (no memory); None when the model cannot be built there (the ranks check)."""
    import torch

    try:
        with torch.device("meta"):
            model = model_file.build()
    except Exception:  # noqa: BLE001 - a model that needs real tensors to build is checked in the ranks
        return None
    shapes = {f"model.{name}": tuple(p.shape) for name, p in model.named_parameters()}
    persistent = set(model.state_dict().keys())
    shapes.update({f"model.{name}": tuple(b.shape) for name, b in model.named_buffers() if name in persistent})
    return shapes


def complete_checkpoints(root: Path) -> list[Path]:
    """The complete checkpoints under ``root``, oldest first."""
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if STEP_DIR.match(p.name) and (p / INFO).is_file()]
    return sorted(found, key=lambda p: p.name)


def find_checkpoint(path: str | Path) -> Path:
    """The checkpoint ``path`` names: a step directory, or the newest complete one in a checkpoint
    directory (its ``latest``, else the highest step)."""
    path = Path(path)
    if (path / INFO).is_file():
        return path
    if not path.exists():
        raise CheckpointError(f"checkpoint '{path}' does not exist; check the path given to --resume.")
    latest = path / LATEST
    if latest.is_file() and (path / latest.read_text().strip() / INFO).is_file():
        return path / latest.read_text().strip()
    found = complete_checkpoints(path)
    if not found:
        raise CheckpointError(
            f"'{path}' holds no complete checkpoint (no step-*/{INFO}); "
            "point --resume at a checkpoint directory written by `autoplan run --checkpoint-dir`."
        )
    return found[-1]


def read_info(step_dir: Path) -> CheckpointInfo:
    """The checkpoint's record, refusing a format this autoplan cannot read."""
    data = read_json(step_dir / INFO, CheckpointError, "checkpoint record")
    version = data.get("format_version") if isinstance(data, dict) else None
    if version != FORMAT_VERSION:
        writer = data.get("autoplan_version", "?") if isinstance(data, dict) else "?"
        raise CheckpointError(
            f"checkpoint '{step_dir}' has format {version!r}, written by autoplan {writer}; "
            f"this autoplan ({__version__}) reads "
            f"format {FORMAT_VERSION}: resume it with the autoplan version that wrote it."
        )
    return CheckpointInfo.from_dict(data, step_dir / INFO)


def read_dcp_metadata(step_dir: Path) -> Any:
    """DCP's metadata of the checkpoint, after checking every file it names is whole."""
    from torch.distributed.checkpoint import FileSystemReader

    try:
        metadata = FileSystemReader(str(step_dir)).read_metadata()
    except Exception as exc:  # noqa: BLE001 - any unreadable metadata is a corrupt checkpoint
        raise CheckpointError(
            f"checkpoint '{step_dir}' has no readable DCP metadata ({type(exc).__name__}); it is corrupt or "
            "incomplete: resume from an earlier step directory."
        ) from None
    needed: dict[str, int] = {}
    for info in (metadata.storage_data or {}).values():
        needed[info.relative_path] = max(needed.get(info.relative_path, 0), info.offset + info.length)
    for name, size in sorted(needed.items()):
        file = step_dir / name
        if not file.is_file() or file.stat().st_size < size:
            have = file.stat().st_size if file.is_file() else "missing"
            raise CheckpointError(
                f"checkpoint file '{file}' is cut short ({have} of {size} bytes); the checkpoint is corrupt: "
                "resume from an earlier step directory."
            )
    return metadata


def check_tensors(step_dir: Path, metadata: Any, expected: dict[str, tuple[int, ...]]) -> None:
    """Every expected tensor is in the checkpoint with the expected global shape."""
    held = metadata.state_dict_metadata
    for key, shape in expected.items():
        if key not in held:
            raise CheckpointError(
                f"checkpoint '{step_dir}' has no tensor '{key}', which the model has: it was written for another "
                "model; resume from this model's checkpoint."
            )
        size = tuple(getattr(held[key], "size", ()))
        if size != tuple(shape):
            raise CheckpointError(
                f"checkpoint '{step_dir}' holds '{key}' with shape {list(size)}, but the model's is {list(shape)}: "
                "it was written for another model; resume from this model's checkpoint."
            )


def check(path: str | Path, expected: dict[str, tuple[int, ...]] | None = None) -> tuple[Path, CheckpointInfo]:
    """The checkpoint ``path`` names, checked as the module docstring says; its record."""
    step_dir = find_checkpoint(path)
    info = read_info(step_dir)
    metadata = read_dcp_metadata(step_dir)
    if expected:
        check_tensors(step_dir, metadata, expected)
    return step_dir, info


def finalize(root: Path, step_dir: Path, info: CheckpointInfo, *, keep: int) -> None:
    """Mark ``step_dir`` complete (its record, then ``latest``) and remove all but the newest ``keep``."""
    info.created_utc = datetime.now(timezone.utc).isoformat(timespec="seconds")
    write_json_atomic(step_dir / INFO, info.to_dict())
    write_text_atomic(root / LATEST, step_dir.name + "\n")
    for old in complete_checkpoints(root)[:-keep] if keep > 0 else []:
        shutil.rmtree(old, ignore_errors=True)
