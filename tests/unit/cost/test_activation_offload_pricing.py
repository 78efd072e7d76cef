"""Activation offload (issue 35 leftovers of issue 34, item 2): the plan field's rules and its price.

Each block that does not recompute sends its saved activations but its output to the host: the device's
activations fall by exactly that, the stage's micro-batch time rises by the copies out and back over the host
link, and the host holds what the micro-batches in flight sent (autoplan/cost/memory/activation_offload.py).
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from synthetic import synthetic_gpt, synthetic_host, synthetic_profile

from autoplan.cost import CostModel
from autoplan.cost.memory.alone import memory_alone
from autoplan.cost.volumes import predict
from autoplan.errors import PlanError
from autoplan.types.plan import Plan

HOST = synthetic_host()


@pytest.fixture(scope="module")
def graph():
    return synthetic_gpt(layers=4, hidden=1024, heads=16, vocab=32000, seq=1024, batch=8)


@pytest.fixture(scope="module")
def model(graph):
    return CostModel(graph, replace(synthetic_profile(), host=HOST))


def _plan(**kw) -> Plan:
    base = dict(devices=2, dp=2, tp=1, pp=1, micro_batch_size=2, num_microbatches=2, precision="bf16")
    return Plan(**{**base, **kw})


def test_the_field_is_checked_in_one_sentence_and_omitted_at_its_default():
    assert "offload_activations" not in _plan().to_dict()
    assert Plan.from_dict(_plan(offload_activations=True).to_dict()).offload_activations is True
    assert "offload-act" in _plan(offload_activations=True).describe()
    refusals = {
        "recompute='full' on every block": dict(recompute="full"),
        "tp, cp and ep hold DTensor": dict(dp=1, tp=2),
        "compile=true": dict(compile=True),
        "only autoplan's executor is priced for it": dict(runtime="megatron"),
        "expected true or false": dict(offload_activations="yes"),
    }
    for words, kw in refusals.items():
        with pytest.raises(PlanError, match=words):
            _plan(**{"offload_activations": True, **kw})
    assert _plan(offload_activations=True, recompute="full", recompute_blocks=[2]).offload_activations


def _summaries(model, plan):
    stages, _tp_plan, _ctx = model.priced_stages(plan)
    return stages[0], [b for b in stages[0].blocks[1:-1]]


def test_each_block_sends_its_saved_activations_but_its_output_and_the_copies_cost_the_link(model):
    plain, offloaded = _plan(), _plan(offload_activations=True)
    before, blocks = _summaries(model, plain)
    after, _ = _summaries(model, offloaded)
    sent = sum(b.saved_bytes - b.output_bytes for b in blocks)
    assert all(0 < b.output_bytes < b.saved_bytes for b in blocks)
    assert after.offloaded_bytes == pytest.approx(sent)
    assert after.saved_bytes == pytest.approx(before.saved_bytes - sent)
    assert after.offload_s == pytest.approx(2 * sent / HOST.link_bytes_per_s)
    plain_cost, cost = model.estimate(plain), model.estimate(offloaded)
    assert cost.compute_s - plain_cost.compute_s == pytest.approx(2 * 2 * sent / HOST.link_bytes_per_s)
    assert cost.peak_memory_bytes < plain_cost.peak_memory_bytes
    paid = cost.extra["activation_offload"]
    assert paid["host_bytes"] == pytest.approx(1 * sent)  # one micro-batch in flight at pp = 1
    assert paid["copy_bytes"] == pytest.approx(2 * sent) and "activation_offload" not in plain_cost.extra


def test_only_the_blocks_that_do_not_recompute_offload(graph, model):
    all_blocks = _summaries(model, _plan(offload_activations=True))[0].offloaded_bytes
    budget = _plan(offload_activations=True, recompute="full", recompute_blocks=[3], stages=[list(graph.layers)])
    assert _summaries(model, budget)[0].offloaded_bytes == pytest.approx(all_blocks / 4)  # identical blocks


def test_no_host_is_one_sentence_and_a_small_host_is_infeasible(graph, model):
    with pytest.raises(PlanError, match="has no host section"):
        CostModel(graph, synthetic_profile()).estimate(_plan(offload_activations=True))
    tiny = CostModel(graph, replace(synthetic_profile(), host=replace(HOST, host_memory_bytes_per_device=1024)))
    cost = tiny.estimate(_plan(offload_activations=True))
    assert not cost.feasible and "GiB of activations) but the host has 0.0 GiB per device" in cost.reason


@pytest.mark.parametrize("steps", [2, 4])
def test_schedule_steps_copy_all_m_micro_batches_and_hold_one_steps(model, steps):
    """k schedule steps of m / k (Plan.schedule_steps): the optimizer step's copies are all m micro-batches' (as the
    stage's compute and cost/volumes.py's act_d2h count them), the host holds one schedule step's in flight."""
    kw = dict(dp=1, pp=2, num_microbatches=8, offload_activations=True, schedule="gpipe")  # m in flight
    plan, whole = _plan(schedule_steps=steps, **kw), _plan(**kw)
    one_step = _plan(**{**kw, "num_microbatches": 8 // steps})
    paid, once, alone = (model.estimate(p).extra["activation_offload"] for p in (plan, whole, one_step))
    assert paid["copy_bytes"] == pytest.approx(once["copy_bytes"]) and paid["copy_s"] == pytest.approx(once["copy_s"])
    assert paid["copy_bytes"] == pytest.approx(max(p.comm[("host", "act_d2h")][1] for p in predict(model, plan)))
    assert paid["copy_bytes"] == pytest.approx(steps * alone["copy_bytes"])
    assert paid["host_bytes"] == pytest.approx(alone["host_bytes"]) and paid["host_bytes"] < once["host_bytes"]
    assert memory_alone(model, plan).extra["activation_offload"] == paid
