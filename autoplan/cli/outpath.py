"""``--out``: checked before a command does any work, so a path it cannot write is one sentence.

Every command that writes declares what its ``--out`` names with ``parser.set_defaults(out_kind=...)``:

- ``"folder"``: a folder to write several files into (plan, trace, run, sweep, report, replan);
- ``"file"``: one file (profile, calibrate, launch);
- ``"file_or_folder"``: a file, or a folder to put the command's own file name in (export).

:func:`check_out` (called by :func:`autoplan.cli.main` before the command runs) refuses a folder
path that is an existing file, a file path that is an existing folder, and any path under an
existing file. Without the check these surfaced late and as ``internal error: FileExistsError``
(``autoplan run`` only after every step had trained, when rank 0 wrote the run folder).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from autoplan.errors import AutoplanError

OUT_KINDS = ("folder", "file", "file_or_folder")


def check_out(args: argparse.Namespace) -> None:
    """Raise AutoplanError in one sentence when ``args.out`` cannot be written as ``args.out_kind`` says."""
    kind, out = getattr(args, "out_kind", None), getattr(args, "out", None)
    if kind is None or not out:
        return
    assert kind in OUT_KINDS, kind
    path, command = Path(out), f"`autoplan {args.command}`"
    if (blocker := _file_above(path)) is not None:
        raise AutoplanError(
            f"--out '{out}' is inside '{blocker}', which is a file, not a folder; name a path outside it."
        )
    if kind == "folder" and path.exists() and not path.is_dir():
        raise AutoplanError(
            f"--out '{out}' is an existing file, but {command} writes a folder of files there; "
            "name a new or existing folder."
        )
    if kind == "file_or_folder" and str(out).endswith(("/", os.sep)) and path.exists() and not path.is_dir():
        raise AutoplanError(
            f"--out '{out}' ends in a slash, which names a folder, but '{path}' is an existing file; "
            "name a folder, or the file without the slash."
        )
    if kind == "file" and path.is_dir():
        raise AutoplanError(f"--out '{out}' is a folder, but {command} writes one file there; name a file.")


def _file_above(path: Path) -> Path | None:
    """The nearest existing parent of ``path`` that is not a folder, if any."""
    for parent in path.parents:
        if parent.exists():
            return None if parent.is_dir() else parent
    return None
