"""The memory floor counts HSDP's replicated states and a one-stage plan's one micro-batch (cost/bounds.py
states_floor_bytes, cost/memory/in_flight_floor.py forward_end_floor): both set plans aside unpriced, never above a
priced peak, and the best plan and its price stay those of pricing every configuration (docs/ilp.md, "Memory
floor")."""

from __future__ import annotations

from dataclasses import replace

import pytest
from synthetic import synthetic_gpt, synthetic_profile
from synthetic.exhaustive import priced_everything

from autoplan.solve.candidates import SearchOptions
from autoplan.solve.pins import parse_fixes
from autoplan.solve.search import Search

#: 16 devices, two nodes: HSDP's 2 x 8 split is offered; one stage: at dp = 16 a micro-batch of 2 is a rank's batch
GRAPH = synthetic_gpt(layers=4, hidden=512, heads=8, vocab=1024, seq=512, batch=32)
TIGHT = synthetic_profile(memory_bytes=int(0.15 * 2**30))  # about a quarter of the plans priced do not fit


@pytest.fixture(scope="module")
def runs():
    options = SearchOptions(devices=16, batch_size=32, fixes=parse_fixes("pp=1"))
    everything = priced_everything(Search(GRAPH, TIGHT, options))
    return Search(GRAPH, TIGHT, options).run(), everything, everything.run()


def _priced(full) -> list:
    return [c for c in full.candidates if c.cost is not None]


def test_the_floor_never_exceeds_a_priced_peak_of_an_hsdp_or_one_micro_batch_plan(runs):
    _, search, full = runs
    priced = _priced(full)
    assert any(c.plan.dp_replicate > 1 for c in priced) and any(c.plan.num_microbatches == 1 for c in priced)
    assert any(c.cost.peak_memory_bytes > TIGHT.device.memory_bytes for c in priced)  # memory binds
    for c in priced:
        assert search.bounds.memory_floor_bytes(c.plan) <= c.cost.peak_memory_bytes, c.plan.describe()


def test_the_floor_counts_the_replicas_states_and_the_one_micro_batch(runs):
    """An HSDP plan's states are sharded over its S ranks, not all dp (R times a ZeRO plan's); a plan of one stage
    and one micro-batch holds that micro-batch's activations at its forward's end, which no other floor counts."""
    _, search, full = runs
    bounds = search.bounds
    hsdp = [c.plan for c in _priced(full) if c.plan.dp_replicate > 1]
    for plan in hsdp:
        assert bounds.states_floor_bytes(plan) > bounds.states_floor_bytes(replace(plan, dp_replicate=1))
    alone = [c.plan for c in _priced(full) if c.plan.num_microbatches == 1 and c.plan.recompute == "none"]
    assert alone and not any(plan.offload_activations for plan in alone)
    for plan in alone:  # its activations are larger than its gradients
        assert bounds.memory_floor_bytes(plan) > bounds.states_floor_bytes(plan), plan.describe()


def test_the_best_plan_is_the_exhaustive_one(runs):
    pruned, _, full = runs
    assert pruned.best.describe() == full.best.describe()
    assert pruned.best_cost.step_time_s == full.best_cost.step_time_s
    assert pruned.evaluated < len(_priced(full)) / 10
