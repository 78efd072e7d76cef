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


def predict_published(runs: pd.DataFrame, *, only: str, why_left_out, predict, profile) -> pd.DataFrame:
    """Each published run whose name contains ``only``: said left out (``why_left_out(row)``, a
    reason or '') or priced (``predict(row, profile, graphs)``, graphs a shared trace memo); the
    priced rows as a table, printed without their plan column."""
    rows, graphs = [], {}
    for _, row in runs.iterrows():
        if only not in row["name"]:
            continue
        reason = why_left_out(row)
        if reason:
            print(f"left out {row['name']}: {reason}")
            continue
        print(f"{row['name']}:")
        rows.append(predict(row, profile, graphs))
    table = pd.DataFrame(rows)
    if not table.empty:
        with pd.option_context("display.width", 250, "display.max_columns", 30):
            print(table.drop(columns=["plan"]).round(3).to_string(index=False))
    return table
