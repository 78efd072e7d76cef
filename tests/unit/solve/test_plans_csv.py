"""plans.csv as ``write_outputs`` writes it (solve/outputs.py; its rows are written in parts, types/tables.py):
read back with the csv module, it holds one row per candidate, the ranked ones first in rank order and the
others by lower bound, each with the candidate's own status, price, lower bound, configuration and reason."""

from __future__ import annotations

import csv
from collections import Counter

import pytest
from synthetic import synthetic_gpt, synthetic_profile

from autoplan.solve.api import plan_graph
from autoplan.solve.outputs import CONFIG_COLUMNS, write_outputs

GRAPH = synthetic_gpt(layers=4, hidden=512, heads=8, vocab=4096, seq=512, batch=16)
PROFILE = synthetic_profile(memory_bytes=8 * 2**30)


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    result = plan_graph(GRAPH, devices=8, profile=PROFILE, batch_size=16, top_k=3)
    out = tmp_path_factory.mktemp("plan")
    paths = write_outputs(out, result=result, graph=GRAPH, profile=PROFILE)
    with open(paths["plans.csv"], newline="") as handle:
        return result, list(csv.DictReader(handle))


def test_one_row_per_candidate_ranked_first_then_by_lower_bound(written):
    result, rows = written
    ranked = result.ranked()
    assert len(rows) == len(result.candidates) and len(ranked) >= 3
    assert [row["rank"] for row in rows[: len(ranked)]] == [str(i) for i in range(1, len(ranked) + 1)]
    assert {row["status"] for row in rows} == {"evaluated", "pruned"}
    rest = [float(row["lower_bound"]) for row in rows[len(ranked) :]]
    assert rest == sorted(rest) and all(row["rank"] == "" for row in rows[len(ranked) :])


def test_each_row_holds_its_candidates_own_cells(written):
    result, rows = written
    columns = ["status", "lower_bound", *CONFIG_COLUMNS, "configurations", "reason", "step_time_s", "feasible"]
    columns += ["peak_memory_bytes", "mfu"]

    def cells(c) -> tuple:
        priced = c.cost is not None and c.objective is not None
        price = (c.cost.step_time_s, c.feasible, c.cost.peak_memory_bytes, c.cost.mfu) if priced else ("",) * 4
        if c.cost is not None and c.objective is None:
            price = ("", c.feasible, c.cost.peak_memory_bytes, "")
        config = [c.config.get(name, "") for name in CONFIG_COLUMNS]
        return tuple(map(str, (c.status, repr(c.lower_bound), *config, c.count, c.reason, *price)))

    assert Counter(tuple(row[name] for name in columns) for row in rows) == Counter(map(cells, result.candidates))
