"""Where every benchmark writes its table: benchmarks/results/NAME.csv, through pandas, atomically.

Benchmarks are run as scripts (``python benchmarks/NAME.py``), so their folder is on sys.path
and they import this module as ``_results``.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from autoplan.types._check import write_text_atomic

RESULTS = Path(__file__).resolve().parent / "results"


def write_results(rows: list[dict] | pd.DataFrame, name: str, *, path: str | Path | None = None) -> Path:
    """Write ``rows`` (dicts or a DataFrame) as CSV to ``path`` or results/NAME.csv and say where."""
    table = rows if isinstance(rows, pd.DataFrame) else pd.DataFrame(rows)
    out = write_text_atomic(Path(path) if path else RESULTS / f"{name}.csv", table.to_csv(index=False))
    print(f"wrote {out}")
    return out
