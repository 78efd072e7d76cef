"""autoplan.cost.memory_alone: a plan's memory as CostModel.estimate prices it, without its time (cost/memory/alone.py),
checked on every plan an exhaustive search prices, those that fit and those that do not, with activations or model
states on the host among them."""

from __future__ import annotations

from dataclasses import fields, replace

from synthetic import synthetic_gpt, synthetic_host, synthetic_profile

from autoplan.cost import memory_alone
from autoplan.solve.candidates import SearchOptions
from autoplan.solve.pins import parse_fixes
from autoplan.solve.search import Search
from autoplan.types.cost import Cost

GRAPH = synthetic_gpt(layers=8, hidden=256, heads=8, vocab=512, seq=512, batch=16)
PROFILE = replace(synthetic_profile(memory_bytes=int(0.15 * 2**30)), host=synthetic_host())
MEMORY_FIELDS = ("weights_bytes", "grads_bytes", "optimizer_bytes", "activations_bytes", "comm_buffer_bytes")
MEMORY_FIELDS += ("peak_memory_bytes", "memory_capacity_bytes", "feasible", "reason")


def test_memory_alone_is_the_memory_estimate_prices_and_no_time():
    search = Search(GRAPH, PROFILE, SearchOptions(devices=4, batch_size=16, fixes=parse_fixes("mbs=4")))
    search._beaten = lambda bound: False  # price every candidate
    search._usable_bytes = float("inf")  # whatever its memory floor
    search.memory_first = False  # and the time of every plan that does not fit
    priced = [c for c in search.run().candidates if c.cost is not None]
    assert any(c.feasible for c in priced) and any(not c.cost.feasible for c in priced)
    assert any(c.plan.pp > 1 for c in priced) and any(c.plan.offload_activations for c in priced)
    for c in priced:
        alone = memory_alone(search.cost_model, c.plan)
        assert {k: getattr(alone, k) for k in MEMORY_FIELDS} == {k: getattr(c.cost, k) for k in MEMORY_FIELDS}
        assert {k: v for k, v in alone.extra.items()} == {k: c.cost.extra[k] for k in alone.extra}
        assert all(getattr(alone, f.name) == 0 for f in fields(Cost) if f.name in Cost.TIME_FIELDS + ("step_time_s",))
