"""Every generated block of numbers in docs/ is what its committed result file says
(benchmarks/docs_numbers.py); a benchmark re-run without regenerating the docs fails here."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_docs_quote_the_committed_results() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "docs_numbers.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_quoted_result_file_is_committed() -> None:
    """The sources of the generated blocks are tracked by git, not ignored outputs."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from docs_numbers import BLOCKS

    for block in BLOCKS.values():
        path = block.source
        ignored = subprocess.run(["git", "-C", str(ROOT), "check-ignore", "-q", path], capture_output=True)
        assert ignored.returncode == 1, f"{path} is git-ignored, but docs/{block.doc} quotes it"
