"""``autoplan explain`` says in one sentence why a plan replicates its ZeRO states (autoplan/report/hsdp.py)."""

from __future__ import annotations

import dataclasses

import pytest
from synthetic import synthetic_gpt, synthetic_profile

from autoplan.cost import CostModel
from autoplan.display import duration_text
from autoplan.report.explain import explain
from autoplan.report.narrate import explanation_markdown
from autoplan.solve.api import plan_graph


@pytest.fixture(scope="module")
def searched():
    graph = synthetic_gpt(layers=4, hidden=512, heads=8, vocab=1024, seq=256, batch=32)
    profile = synthetic_profile()
    result = plan_graph(graph, devices=16, profile=profile, batch_size=32, fix="dp=16,zero=3,dp_replicate=2")
    return graph, profile, result


def test_the_sentence_sets_hsdp_beside_full_sharding_with_their_own_prices(searched):
    graph, profile, result = searched
    exp = explain(result, graph=graph, profile=profile, sensitivity=False)
    flat = CostModel(graph, profile).estimate(dataclasses.replace(result.best, dp_replicate=1, predicted=None))
    best = result.best_cost
    said = exp.hsdp
    assert said.startswith("dp_replicate=2 replicates the ZeRO-3 states across 2 groups of 8 ranks")
    assert "run within one node instead of across 2 nodes for all 16 ranks" in said
    assert f"takes {duration_text(best.zero_comm_s + best.dp_comm_exposed_s)} per step" in said
    assert f"the {duration_text(flat.zero_comm_s + flat.dp_comm_exposed_s)} of full sharding" in said
    assert f"against {flat.peak_memory_bytes / 2**30:.1f} GiB." in said
    assert f"**HSDP:** {said}" in explanation_markdown(exp)


def test_a_plan_without_hsdp_says_nothing_of_it(searched):
    graph, profile, result = searched
    plain = plan_graph(graph, devices=16, profile=profile, batch_size=32, fix="dp=16,zero=3,dp_replicate=1")
    assert explain(plain, graph=graph, profile=profile, sensitivity=False).hsdp == ""
