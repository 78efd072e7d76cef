"""Local SGD and DiLoCo in the search (solve/local_sgd.py), explain (report/local_sgd.py) and the command line:
offered only under --allow-lossy and where the executor runs them, pinnable, and explained as a convergence trade
the cost model cannot see."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from synthetic import gpt_graph, synthetic_profile

from autoplan.cli import main
from autoplan.cost.model import CostModel
from autoplan.errors import PlanError
from autoplan.report.explain import explain_result
from autoplan.solve.api import plan_graph
from autoplan.solve.pins import parse_fixes
from autoplan.types.local_sgd import synchronous_fields
from autoplan.types.plan import Plan

#: two sites of 8-GPU nodes joined by 10 Gb/s
TWO_SITES = synthetic_profile(inter_busbw_bytes_per_s=1.25e9, name="two-sites")
MLP = str(Path(__file__).resolve().parents[3] / "examples" / "mlp.py")


@pytest.fixture(scope="module")
def graph():
    return gpt_graph(layers=4, hidden=512, batch_size=16)


def _outer(candidates) -> set:
    return {(c.plan.sync_every, c.plan.outer_optimizer) for c in candidates if c.plan is not None}


def test_only_allow_lossy_searches_an_outer_sync_and_then_diloco_wins_across_the_slow_link(graph):
    exact = plan_graph(graph, devices=16, profile=TWO_SITES, fix="dp=16")
    assert _outer(exact.candidates) == {(1, "average")}
    lossy = plan_graph(graph, devices=16, profile=TWO_SITES, fix="dp=16,grad_compression=none", allow_lossy=True)
    assert _outer(lossy.candidates) == {(1, "average"), (16, "average"), (500, "nesterov")}
    assert (lossy.best.sync_every, lossy.best.outer_optimizer) == (500, "nesterov")
    assert lossy.best_cost.step_time_s < exact.best_cost.step_time_s


def test_pins_name_the_outer_sync_and_a_lossy_one_needs_allow_lossy(graph):
    pinned = plan_graph(graph, devices=16, profile=TWO_SITES, fix="dp=16,sync_every=8,outer_optimizer=nesterov",
                        allow_lossy=True)  # fmt: skip
    assert _outer(pinned.candidates) == {(8, "nesterov")}
    with pytest.raises(PlanError, match="--fix sync_every=8 is lossy"):
        plan_graph(graph, devices=16, profile=TWO_SITES, fix="sync_every=8")
    with pytest.raises(PlanError, match="--fix outer_optimizer=nesterov .* is lossy"):
        plan_graph(graph, devices=16, profile=TWO_SITES, fix="outer_optimizer=nesterov")
    with pytest.raises(PlanError, match="expected one of average, nesterov"):
        parse_fixes("outer_optimizer=adam")
    synchronous = plan_graph(graph, devices=16, profile=TWO_SITES, fix="dp=16,sync_every=1")
    assert _outer(synchronous.candidates) == {(1, "average")}


def test_explain_says_what_the_outer_sync_saves_and_that_h_is_a_convergence_trade(graph):
    result = plan_graph(graph, devices=16, profile=TWO_SITES, fix="dp=16,zero=3,dp_replicate=2,sync_every=500",
                        allow_lossy=True)  # fmt: skip
    said = explain_result(result, graph=graph, profile=TWO_SITES, sensitivity=False)
    assert "averages the 2 replicas' parameters once every 500 steps (across 2 nodes)" in said.local_sgd
    assert "convergence trade the cost model cannot see" in said.local_sgd and said.hsdp == ""
    synced = CostModel(graph, TWO_SITES).estimate(replace(result.best, predicted=None, **synchronous_fields()))
    assert f"against {synced.step_time_s * 1e3:.3g} ms" in said.local_sgd
    assert "**Local SGD:**" in said.to_markdown()


def test_the_cli_refuses_a_plan_whose_outer_sync_cannot_run_in_one_sentence(tmp_path, capsys):
    plan = Plan(devices=2, dp=2, tp=1, pp=1, micro_batch_size=1, num_microbatches=1).to_dict()
    path = tmp_path / "plan.json"
    path.write_text(json.dumps({**plan, "zero_stage": 2, "sync_every": 8}))
    assert main(["run", MLP, "--plan", str(path), "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert "leaves no replicas to average" in err and "Traceback" not in err and err.count("\n") == 1
