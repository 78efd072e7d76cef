"""The search offloads activations only where a plan needs it (a plan that does not fit is priced again with
its activations on the host), ``--fix offload_activations=...`` pins it, a pin it cannot run is one sentence,
and explain says why and what the next option costs (docs/cost-model.md, "Activation offload")."""

from __future__ import annotations

from dataclasses import replace

import pytest
from synthetic import synthetic_gpt, synthetic_host, synthetic_profile

from autoplan.errors import PlanError
from autoplan.report.explain import explain_result
from autoplan.solve.api import plan_graph

GRAPH = synthetic_gpt(layers=4, hidden=1024, heads=16, vocab=32000, seq=1024, batch=8)


def _profile(memory_gib: float, host=synthetic_host()):
    return replace(synthetic_profile(memory_bytes=int(memory_gib * 2**30)), host=host)


def _plan(memory_gib: float, fix: str, host=synthetic_host()):
    return plan_graph(GRAPH, devices=2, profile=_profile(memory_gib, host), batch_size=8, fix=fix)


def test_activations_are_offloaded_only_where_the_plan_does_not_fit_without():
    assert not _plan(8.0, "dp=2,mbs=4,recompute=none").best.offload_activations
    tight = _plan(3.0, "dp=2,mbs=4,recompute=none")
    assert tight.best.offload_activations and tight.best_cost.feasible
    with pytest.raises(PlanError, match="no plan fits in device memory"):
        _plan(3.0, "dp=2,mbs=4,recompute=none,offload=none,offload_activations=off")
    # recomputing is cheaper than the copies over a 25 GB/s link on an A100: free, the search recomputes
    free = _plan(3.0, "dp=2,mbs=4")
    assert free.best.recompute != "none" and not free.best.offload_activations


def test_a_pin_offloads_every_plan_that_can_and_says_why_where_none_can():
    pinned = _plan(8.0, "dp=2,offload_activations=on")
    assert all(c.plan.offload_activations for c in pinned.candidates if c.plan is not None)
    assert all(c.plan.recompute == "none" or c.plan.recompute_blocks for c in pinned.candidates if c.plan)
    with pytest.raises(PlanError, match="profile 'synthetic-a100' has no host section"):
        _plan(8.0, "offload_activations=on", host=None)
    with pytest.raises(PlanError, match="tp=2: activations are offloaded at tp = cp = ep = 1"):
        _plan(8.0, "tp=2,offload_activations=on")
    with pytest.raises(PlanError, match="recompute=full on every block"):
        _plan(8.0, "recompute=full,offload_activations=on")
    small = replace(synthetic_host(), host_memory_bytes_per_device=2**20)  # the host, not the device, refuses them
    with pytest.raises(PlanError, match=r"no plan fits in host memory: the most frugal .* fits the device, but "):
        _plan(8.0, "dp=2,offload_activations=on,offload=none", host=small)


def test_explain_says_why_it_offloads_and_what_the_next_option_costs():
    profile = _profile(3.0)  # bf16 under autocast: fp32 residual stream and log-probs (cost/compute/dtypes.py)
    fix = "dp=2,mbs=4,recompute=none,offload=none"
    result = plan_graph(GRAPH, devices=2, profile=profile, batch_size=8, fix=fix)
    said = explain_result(result, graph=GRAPH, profile=profile, sensitivity=False).activation_offload
    assert said.startswith("offload_activations keeps 0.62 GiB of saved activations per device on the host")
    assert "without it no plan fits, recomputing or not" in said and said.endswith("GiB usable.")
    result = plan_graph(GRAPH, devices=2, profile=profile, batch_size=8, fix="dp=2,mbs=4,recompute=none")
    said = explain_result(result, graph=GRAPH, profile=profile, sensitivity=False).activation_offload
    assert "the best plan without it, without recompute (" in said and "offload=full), steps in" in said
    pinned = plan_graph(GRAPH, devices=2, profile=profile, batch_size=8, fix="dp=2,mbs=4,offload_activations=on")
    said = explain_result(pinned, graph=GRAPH, profile=profile, sensitivity=False).activation_offload
    assert "the best plan without it, recomputing (full)" in said and " ms less, in " in said
