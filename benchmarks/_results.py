"""Where every benchmark writes its table: benchmarks/results/NAME.csv, through pandas, atomically.

Benchmarks are run as scripts (``python benchmarks/NAME.py``), so their folder is on sys.path
and they import this module as ``_results``.
"""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd

from autoplan.errors import PlanError
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
    reason or '') or priced (``predict(row, profile, graphs)``, graphs a shared trace memo; a layout the
    cost model refuses is said left out with its sentence); the priced rows as a table, printed without
    their plan column."""
    rows, graphs = [], {}
    for _, row in runs.iterrows():
        if only not in row["name"]:
            continue
        reason = why_left_out(row)
        if reason:
            print(f"left out {row['name']}: {reason}")
            continue
        print(f"{row['name']}:")
        try:
            rows.append(predict(row, profile, graphs))
        except PlanError as refused:  # a layout the model cannot take as published, in the cost model's words
            print(f"left out {row['name']}: {refused}")
    table = pd.DataFrame(rows)
    if not table.empty:
        with pd.option_context("display.width", 250, "display.max_columns", 30):
            print(table.drop(columns=["plan"]).round(3).to_string(index=False))
    return table


#: the FP8 recipe a published row names in its precision text, by its words (types/runtime.py FP8_RECIPES)
RECIPE_WORDS = (("delayed", "te_delayed"), ("cs", "te_current"), ("current", "te_current"), ("rowwise", "rowwise"))


def runtime_fields(row: pd.Series, *, zero_stage: int) -> dict:
    """The Plan fields that say how a published row's software ran it (docs/cost-model.md, "Runtimes"):
    its ``runtime`` column; ``compile`` where its ``compile`` column says yes (torchtitan's tables:
    "torch.compile"); the FP8 recipe its precision text names (Megatron's default, current scaling,
    where it names none); and, for Megatron's distributed optimizer (ZeRO-1), the parameter
    all-gather overlapped with the next forward, as Megatron-Bridge and NeMo run it
    (docs.nvidia.com/nemo/megatron-bridge/latest/training/communication-overlap.html: the DP
    reduce-scatter and all-gather are chunked per layer and overlapped with compute)."""
    runtime = str(row.get("runtime", "autoplan"))
    fields: dict = {"runtime": runtime, "compile": str(row.get("compile", "no")).lower() == "yes"}
    text = str(row.get("precision", "")).lower()
    if text.startswith("fp8") and runtime in ("megatron", "megatron-lm-2022"):
        named = [recipe for word, recipe in RECIPE_WORDS if word in re.split(r"[^a-z]+", text)]
        fields["fp8_recipe"] = named[0] if named else ""
    if runtime == "megatron" and zero_stage == 1:
        fields["overlap_param_gather"] = True
    return fields
