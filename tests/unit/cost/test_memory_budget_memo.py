"""memory_budget prices the nodes outside every block once per context and byte factors on the search's op times
(cost/tp/split_prices.py ``_outside_prices``): plans that share them but differ in their outside splits, their comm
buffers or their stages read the same prices, and every budget equals the one priced afresh."""

import pytest
from synthetic import synthetic_gpt, synthetic_profile

import autoplan.cost.tp.split_prices as split_prices
from autoplan.cost import CostModel
from autoplan.cost.tp.default import default_tp_plan
from autoplan.cost.tp.split_prices import memory_budget
from autoplan.types import Plan

TP = 4


def _plan(graph, **fields):
    fields = {**dict(dp=1, tp=TP, pp=1, micro_batch_size=2, num_microbatches=2, precision="bf16"), **fields}
    fields.setdefault("tp_plan", default_tp_plan(graph, TP))
    return Plan(devices=fields["dp"] * fields["tp"] * fields["pp"], **fields)


@pytest.fixture
def pricings(monkeypatch):
    """The outside prices memory_budget computes (price_block calls)."""
    calls = []
    plain = split_prices.price_block
    monkeypatch.setattr(split_prices, "price_block", lambda *a, **kw: calls.append(kw["ctx"]) or plain(*a, **kw))
    return calls


def test_plans_that_share_a_context_share_the_outside_prices(pricings):
    graph, profile = synthetic_gpt(layers=2, batch=16, vocab=4096), synthetic_profile()
    model = CostModel(graph, profile)
    default = _plan(graph)
    whole = _plan(graph, tp_plan={**default.tp_plan, "wte": "replicate", "head": "replicate"})
    for plan in (default, whole):
        cost = model.estimate(plan)
        budget = memory_budget(graph, profile, plan=plan, cost=cost, node_times=model.node_times)
        assert budget == memory_budget(graph, profile, plan=plan, cost=cost)  # priced afresh: no node_times
    assert len(pricings) == 3  # the first plan's context once, and twice afresh
    cost = model.estimate(default)
    smaller = memory_budget(graph, profile, plan=default, cost=cost, node_times=model.node_times)
    larger = memory_budget(graph, profile, plan=whole, cost=cost, node_times=model.node_times)
    assert smaller.outside_bytes < larger.outside_bytes
    assert len(pricings) == 3


def test_another_context_or_profile_is_priced_anew(pricings):
    graph, profile = synthetic_gpt(layers=2, batch=16, vocab=4096), synthetic_profile()
    model = CostModel(graph, profile)
    plans = (_plan(graph), _plan(graph, micro_batch_size=4, num_microbatches=1), _plan(graph, sequence_parallel=True))
    for plan in plans:
        cost = model.estimate(plan)
        budget = memory_budget(graph, profile, plan=plan, cost=cost, node_times=model.node_times)
        assert budget == memory_budget(graph, profile, plan=plan, cost=cost)
    assert len(pricings) == 2 * len(plans)
    other = synthetic_profile(memory_bytes=40 * 2**30)  # another profile object: the memo is the search's profile's
    cost = CostModel(graph, other).estimate(plans[0])
    budget = memory_budget(graph, other, plan=plans[0], cost=cost, node_times=model.node_times)
    assert budget == memory_budget(graph, other, plan=plans[0], cost=cost) and len(pricings) == 2 * len(plans) + 2
