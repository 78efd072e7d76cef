"""Frozen parameters (requires_grad=False) priced as the executor runs them (docs/cost-model.md,
"Frozen parameters"): held weights, no gradient, no optimizer state, no gradient sync."""

from __future__ import annotations

from dataclasses import replace

import pytest
from synthetic import a100_profile, synthetic_gpt, synthetic_profile

from autoplan.cost.memory.per_device import model_states
from autoplan.cost.model import CostModel
from autoplan.cost.volumes import predict
from autoplan.solve.search import Search, SearchOptions
from autoplan.solve.stage_costs import StageCosts
from autoplan.types.graph import Graph
from autoplan.types.plan import Plan


def _graph() -> Graph:
    return synthetic_gpt(layers=4, hidden=256, heads=8, vocab=8000, seq=128, batch=16)


def _frozen(graph: Graph, trainable=lambda name: False) -> Graph:
    """``graph`` with every parameter frozen but those ``trainable`` names."""
    params = {name: replace(info, trainable=trainable(name)) for name, info in graph.parameters.items()}
    return replace(graph, parameters=params)


def _mlp_only(name: str) -> bool:
    """Like adapters: a few linears of each block train, the rest is frozen; the embedding trains
    too, so every block's backward is alike (a synthetic graph's groups do not follow its freezing)."""
    return ".mlp." in name or name.startswith("wte")


def _plan(**changes) -> Plan:
    fields = dict(devices=8, dp=8, tp=1, pp=1, micro_batch_size=1, num_microbatches=2, precision="bf16")
    fields.update(changes)
    fields["devices"] = fields["dp"] * fields["tp"] * fields["pp"]
    return Plan(**fields)


@pytest.mark.parametrize("zero", [0, 1, 2, 3])
def test_frozen_parameters_hold_weights_but_no_gradients_or_optimizer_state(zero):
    graph = _graph()
    part = _frozen(graph, _mlp_only)
    share = part.trainable_param_count / graph.param_count
    assert 0 < share < 1
    plan = _plan(zero_stage=zero)
    full, lora, none = (CostModel(g, a100_profile()).estimate(plan) for g in (graph, part, _frozen(graph)))
    assert lora.weights_bytes == full.weights_bytes == none.weights_bytes
    assert lora.grads_bytes == pytest.approx(full.grads_bytes * share, rel=1e-6)
    assert lora.optimizer_bytes == pytest.approx(full.optimizer_bytes * share, rel=1e-6)
    assert none.grads_bytes == none.optimizer_bytes == 0
    assert none.optimizer_s == 0 and lora.optimizer_s < full.optimizer_s
    assert none.peak_memory_bytes < lora.peak_memory_bytes < full.peak_memory_bytes


@pytest.mark.parametrize("zero", [0, 1, 2])
def test_frozen_parameters_send_no_gradients(zero):
    graph = _graph()
    frozen = _frozen(graph)
    plan = _plan(zero_stage=zero)
    full, none = (CostModel(g, a100_profile()).estimate(plan) for g in (graph, frozen))
    assert full.dp_comm_s > 0
    weights_only = zero == 2  # FSDP2 still gathers the frozen weights it shards
    assert (none.dp_comm_s > 0) == weights_only and none.dp_comm_s < full.dp_comm_s


def test_the_audit_predicts_gradient_bytes_of_the_trainable_parameters_only():
    graph = _frozen(_graph(), lambda name: ".mlp." in name)
    trained = graph.trainable_param_count
    (ddp,) = predict(CostModel(graph, a100_profile()), _plan(zero_stage=0))
    assert ddp.comm[("dp", "all_reduce")][1] == pytest.approx(4 * trained)
    assert ddp.param_elements == graph.param_count
    (fsdp,) = predict(CostModel(graph, a100_profile()), _plan(zero_stage=3))
    count, sent = fsdp.comm[("dp", "reduce_scatter")]
    assert sent == pytest.approx(2 * 4 * trained)  # each of 2 micro-batches, fp32
    assert count == 2 * len(graph.layers)  # the root unit (embedding, norm, head) is frozen: nothing to reduce
    gathers, gathered = fsdp.comm[("dp", "all_gather")]
    assert gathered == pytest.approx(2 * 2 * 2 * graph.param_count)  # forward and backward, bf16, every weight
    assert gathers == 2 * 2 * (len(graph.layers) + 1)


def test_the_search_bounds_stay_below_a_frozen_models_prices():
    graph = _frozen(_graph(), _mlp_only)
    search = Search(graph, synthetic_profile(), SearchOptions(devices=8, batch_size=16, keep=10**6))
    result = search.run()
    priced = [c for c in result.candidates if c.cost is not None]
    assert priced and all(c.lower_bound <= c.objective * (1 + 1e-9) for c in priced if c.status == "evaluated")
    assert all(search.bounds.states_floor_bytes(c.plan) <= c.cost.peak_memory_bytes * (1 + 1e-12) for c in priced)


def test_the_pipeline_partition_charges_frozen_parameters_their_weights_only():
    """The partition's per-block bytes (solve/stage_costs.py) follow the cost model's states."""
    graph = _graph()
    plan = _plan(zero_stage=1)
    full, lora, none = (
        StageCosts(g, a100_profile()).problem(plan) for g in (graph, _frozen(graph, _mlp_only), _frozen(graph))
    )
    weights = model_states(params=1.0, precision="bf16", zero_stage=1, dp=8, trainable=0.0).weights_bytes
    block = graph.layers[0]
    held = sum(info.numel for name, info in graph.parameters.items() if name.startswith(block + "."))
    assert none.layer_static_bytes[0] == pytest.approx(held * weights)
    assert none.layer_static_bytes[0] < lora.layer_static_bytes[0] < full.layer_static_bytes[0]
