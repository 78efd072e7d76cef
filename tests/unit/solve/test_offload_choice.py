"""The search offers offload where the executor runs it and picks it only where a plan needs it (issue 34
item 2); ``--fix offload=...`` pins it, and a pin the profile or the ZeRO pin cannot run is one sentence."""

from __future__ import annotations

from dataclasses import replace

import pytest
from synthetic import synthetic_gpt, synthetic_host, synthetic_profile

from autoplan.errors import PlanError
from autoplan.report.explain import explain_result
from autoplan.solve.api import plan_graph
from autoplan.types.host_spec import HostProfile

HOST = synthetic_host()
GRAPH = synthetic_gpt(layers=4, hidden=1024, heads=16, vocab=32000, seq=1024, batch=8)


def _profile(memory_gib: float, host: HostProfile | None = HOST):
    return replace(synthetic_profile(memory_bytes=int(memory_gib * 2**30)), host=host)


def _plan(memory_gib: float, fix: str | None = None, host: HostProfile | None = HOST):
    return plan_graph(GRAPH, devices=2, profile=_profile(memory_gib, host), batch_size=8, fix=fix)


def test_offload_only_where_nothing_fits_without_it():
    assert _plan(8.0).best.offload == "none"
    tight = _plan(0.5)
    assert tight.best.offload == "full" and tight.best_cost.feasible
    with pytest.raises(PlanError, match="no plan fits in device memory"):
        _plan(0.5, fix="offload=none")


def test_a_pin_runs_where_it_can_and_says_why_where_it_cannot():
    assert _plan(8.0, fix="offload=optimizer").best.zero_stage == 1
    with pytest.raises(PlanError, match="profile 'synthetic-a100' has no host section"):
        _plan(8.0, fix="offload=full", host=None)
    with pytest.raises(PlanError, match="runs on ZeRO-3 and --fix zero=1 is not it"):
        _plan(8.0, fix="offload=full,zero=1")
    with pytest.raises(PlanError, match="--fix offload=disk is not valid; expected one of none, optimizer, full"):
        _plan(8.0, fix="offload=disk")


def test_explain_says_why_it_offloads_and_what_the_step_pays():
    profile = _profile(0.5)
    result = plan_graph(GRAPH, devices=2, profile=profile, batch_size=8)
    said = explain_result(result, graph=GRAPH, profile=profile, sensitivity=False).offload
    assert said.startswith("offload=full keeps every model state on the host")
    assert "without offload no plan fits" in said and "GiB more than the 0.5 GiB usable" in said
    assert explain_result(_plan(8.0), graph=GRAPH, profile=_profile(8.0), sensitivity=False).offload == ""
