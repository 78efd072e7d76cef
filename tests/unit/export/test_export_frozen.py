"""A plan for a model with frozen parameters, exported to a framework that trains its own model
definition (torchtitan, Megatron-LM), says in one sentence that the config cannot freeze them."""

from __future__ import annotations

from dataclasses import replace

import pytest
from synthetic import synthetic_gpt

from autoplan.export.api import export_plan
from autoplan.types.plan import Plan

PLAN = Plan(devices=8, dp=8, tp=1, pp=1, micro_batch_size=1, num_microbatches=2, zero_stage=3, precision="bf16")


def _graph(frozen: bool):
    graph = synthetic_gpt(layers=2, hidden=128, heads=4, vocab=1000, seq=64, batch=16)
    trains = {name: not frozen or ".mlp." in name for name in graph.parameters}
    return replace(graph, parameters={n: replace(i, trainable=trains[n]) for n, i in graph.parameters.items()})


@pytest.mark.parametrize("framework", ["torchtitan", "megatron"])
def test_frozen_parameters_are_named_where_the_framework_trains_its_own_model(framework):
    graph = _graph(frozen=True)
    share = 1 - graph.trainable_param_count / graph.param_count
    exported = export_plan(PLAN, to=framework, graph=graph)
    note = next(n for n in exported.unexpressed if "frozen" in n)
    assert note.startswith(f"{share:.1%} of the traced model's parameters are frozen")
    assert "frozen (requires_grad=False)" in exported.text
    assert not any("frozen" in n for n in export_plan(PLAN, to=framework, graph=_graph(frozen=False)).unexpressed)


@pytest.mark.parametrize("framework", ["deepspeed", "accelerate"])
def test_frameworks_that_train_the_users_model_keep_its_frozen_parameters_without_a_note(framework):
    assert not any("frozen" in n for n in export_plan(PLAN, to=framework, graph=_graph(frozen=True)).unexpressed)
