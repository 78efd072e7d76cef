"""Sparse embedding gradients' price (cost/dp/sparse_embedding.py): the occupancy estimate of the rows a
rank's step touches, or --touched-rows; the tables leave DDP's dense all-reduce and travel as all-gathered
(index, row) pairs, in the step time and the audit's predicted volumes alike."""

import dataclasses
import math
from pathlib import Path

import pytest

from autoplan.cost import CostModel, predict_volumes
from autoplan.cost.dp.sparse_embedding import INDEX_BYTES, expected_distinct_rows, sparse_tables
from autoplan.profile.io import load_profile
from autoplan.report.sparse_grads import dense_tables, sparse_grads_why
from autoplan.solve.sparse_grads import with_touched_rows
from autoplan.trace.api import trace_model_file
from autoplan.types.plan import Plan

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "sparse_embedding.py"
DIM, VOCAB, SEQ, CATEGORIES, BAG = 32, 4096, 16, 256, 4  # examples/sparse_embedding.py's defaults
ROW_BYTES = DIM * 4 + INDEX_BYTES


@pytest.fixture(scope="module")
def graph():
    return trace_model_file(EXAMPLE, 8)


@pytest.fixture(scope="module")
def plan(graph):
    return Plan(devices=2, dp=2, tp=1, pp=1, micro_batch_size=2, num_microbatches=2, stages=[], model=graph.model_name)


def _dense(graph):
    params = {k: dataclasses.replace(v, sparse_grad=False) for k, v in graph.parameters.items()}
    return dataclasses.replace(graph, parameters=params)


def test_occupancy_estimate():
    assert expected_distinct_rows(100, 1) == pytest.approx(1.0)
    assert expected_distinct_rows(2, 2) == pytest.approx(1.5)  # 2 (1 - 1/4)
    assert expected_distinct_rows(10, 10_000) == pytest.approx(10.0)
    assert expected_distinct_rows(1000, 50) < 50


def test_tables_and_their_reads_come_from_the_trace(graph):
    found = {t.name: (t.rows, t.dim, t.reads_per_sample) for t in sparse_tables(graph)}
    assert found == {"tokens.weight": (VOCAB, DIM, SEQ), "categories.weight": (CATEGORIES, DIM, BAG)}


def _dp(graph, plan):
    [stage] = predict_volumes(CostModel(graph, load_profile("cpu-gloo")), plan)
    return stage.comm


def test_volumes_move_the_tables_from_the_dense_all_reduce_to_the_all_gathers(graph, plan):
    sparse, dense = _dp(graph, plan), _dp(_dense(graph), plan)
    assert dense[("dp", "all_reduce")][1] - sparse[("dp", "all_reduce")][1] == 4 * DIM * (VOCAB + CATEGORIES)
    tokens = 2 * 2 * SEQ  # a rank's 4 samples, both micro-batches: one sync
    rows = expected_distinct_rows(VOCAB, tokens) + expected_distinct_rows(CATEGORIES, 2 * 2 * BAG)
    assert sparse[("dp", "all_gather")] == [4, pytest.approx(2 * rows * ROW_BYTES)]
    assert ("dp", "all_gather") not in dense


def test_touched_rows_replaces_the_estimate_and_moves_the_step_time(graph, plan):
    given = with_touched_rows(graph, 10)
    assert _dp(given, plan)[("dp", "all_gather")][1] == 2 * (10 + 10) * ROW_BYTES
    profile = load_profile("cpu-gloo")
    more = with_touched_rows(graph, 4096)
    assert CostModel(more, profile).estimate(plan).dp_comm_s > CostModel(given, profile).estimate(plan).dp_comm_s
    assert math.isclose(sum(t.rows for t in sparse_tables(more)), VOCAB + CATEGORIES)


def test_explain_says_what_the_sparse_sync_sends_and_what_dense_tables_would_cost(graph, plan):
    model = CostModel(graph, load_profile("cpu-gloo"))
    said = sparse_grads_why(model, plan, model.estimate(plan))
    assert said.startswith("tokens.weight, categories.weight take sparse gradients, so DDP all-gathers the ~")
    assert "557 kB of tables" in said and "read densely, which" in said and said.endswith("sparse=False.")
    dense = CostModel(dense_tables(graph), load_profile("cpu-gloo"))
    assert sparse_grads_why(dense, plan, dense.estimate(plan)) == ""
