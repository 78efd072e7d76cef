"""``autoplan explain`` says in one sentence what a model's frozen parameters save its plan
(autoplan/report/frozen.py): measured against the same plan priced with every parameter trained."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest
from synthetic import synthetic_gpt, synthetic_profile

from autoplan.cost.model import CostModel
from autoplan.display import number_text
from autoplan.report.explain import explain
from autoplan.solve.api import plan_graph


def _frozen_graph():
    graph = synthetic_gpt(layers=4, hidden=256, heads=8, vocab=8000, seq=128, batch=16)
    trains = {name: ".mlp." in name or name.startswith("wte") for name in graph.parameters}
    return replace(graph, parameters={n: replace(i, trainable=trains[n]) for n, i in graph.parameters.items()})


@pytest.fixture(scope="module")
def explained():
    graph, profile = _frozen_graph(), synthetic_profile()
    result = plan_graph(graph, devices=8, profile=profile, batch_size=16, fix="dp=8")
    return graph, profile, result, explain(result, graph=graph, profile=profile, sensitivity=False)


def test_explain_says_how_many_parameters_are_frozen_and_what_that_saves(explained):
    graph, profile, result, exp = explained
    frozen = 1 - graph.trainable_param_count / graph.param_count
    assert exp.frozen.startswith(f"{frozen:.1%} of the parameters are frozen")
    best = result.ranked()[0]
    whole = replace(graph, parameters={n: replace(i, trainable=True) for n, i in graph.parameters.items()})
    trained = CostModel(whole, profile).estimate(best.plan)
    states = trained.grads_bytes + trained.optimizer_bytes - best.cost.grads_bytes - best.cost.optimizer_bytes
    assert states > 0 and f"({number_text(states / 2**30)} GiB per device less" in exp.frozen
    assert re.search(r"send no gradient sync \([0-9.]+ (ms|µs) less per step\)", exp.frozen)
    assert "**Frozen parameters:** " + exp.frozen in exp.to_markdown()


def test_a_model_that_trains_everything_gets_no_frozen_sentence():
    graph, profile = synthetic_gpt(layers=2, hidden=128, heads=4, vocab=1000, seq=64, batch=8), synthetic_profile()
    result = plan_graph(graph, devices=8, profile=profile, batch_size=8, fix="dp=8")
    assert explain(result, graph=graph, profile=profile, sensitivity=False).frozen == ""
