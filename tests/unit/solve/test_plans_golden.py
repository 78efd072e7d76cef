"""Refactoring must not move a number: plans.csv of a fixed search equals the committed one.

The search below (a synthetic 8-block GPT on 16 synthetic A100s, free plan, every pruning rule
active) writes plans.csv; every column must equal tests/unit/solve/data/plans_golden.csv, numbers
to 1e-9 relative. A change that is meant to re-price plans regenerates the file with
``AUTOPLAN_REGENERATE_GOLDEN=1 python -m pytest tests/unit/solve/test_plans_golden.py`` and says why
in its commit.
"""

from __future__ import annotations

import io
import os
from pathlib import Path

import pandas as pd
import pytest
from synthetic import synthetic_gpt, synthetic_profile

from autoplan.solve.api import plan_graph
from autoplan.solve.outputs import plans_csv

GOLDEN = Path(__file__).parent / "data" / "plans_golden.csv"
VOLATILE = ("reason",)  # carries thresholds printed to 4 digits; its words are checked below


def _plans() -> pd.DataFrame:
    graph = synthetic_gpt(layers=8, hidden=1024, heads=16, vocab=32000, seq=1024, batch=32)
    result = plan_graph(graph, devices=16, profile=synthetic_profile(memory_bytes=24 * 2**30), batch_size=32, top_k=5)
    return pd.read_csv(io.StringIO(plans_csv(result)), dtype=str, keep_default_na=False)


def _value(text: str):
    try:
        return float(text)
    except ValueError:
        return text


def _cell(text: str):
    """A number as an approx (1e-9 relative: the last bits may differ between libms), else the text."""
    try:
        return pytest.approx(float(text), rel=1e-9, abs=1e-15)
    except ValueError:
        return text


def test_plans_csv_equals_the_committed_one():
    plans = _plans()
    if os.environ.get("AUTOPLAN_REGENERATE_GOLDEN"):
        GOLDEN.write_text(plans.to_csv(index=False))
    golden = pd.read_csv(GOLDEN, dtype=str, keep_default_na=False)
    assert list(plans.columns) == list(golden.columns) and len(plans) == len(golden)
    for column in plans.columns:
        if column not in VOLATILE:
            assert [_value(v) for v in plans[column]] == [_cell(v) for v in golden[column]], column
    kinds = lambda frame: frame["reason"].str.split(":").str[0].tolist()  # noqa: E731
    assert kinds(plans) == kinds(golden)
