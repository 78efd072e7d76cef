"""tp_comm_overlap: priced from the decomposition (autoplan/cost/tp/overlap.py), searched where it
can run, refused before any rank starts where it cannot."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from synthetic import synthetic_gpt, synthetic_profile

from autoplan.cost.model import CostModel
from autoplan.cost.tp.default import default_tp_plan
from autoplan.cost.tp.overlap import exposed_tp_s
from autoplan.errors import PlanError
from autoplan.execute.tp_overlap import check_runs_here
from autoplan.profile import load_profile
from autoplan.solve.api import plan_graph
from autoplan.solve.candidates import SearchOptions
from autoplan.solve.search import Search
from autoplan.types.plan import Plan

ROOT = Path(__file__).resolve().parents[3]


def test_a_collective_shorter_than_its_matmul_shows_one_slice():
    assert exposed_tp_s(comm_s=4.0, matmul_s=8.0, tp=4, efficiency=1.0) == pytest.approx(1.0)


def test_a_collective_longer_than_its_matmul_shows_its_excess_per_slice():
    # c = 2, g = 1 per slice: c + 3 (c - g) = 5
    assert exposed_tp_s(comm_s=8.0, matmul_s=4.0, tp=4, efficiency=1.0) == pytest.approx(5.0)


@pytest.mark.parametrize("eta", [0.0, 0.3, 1.0])
def test_partial_overlap_keeps_eta_of_what_hides(eta):
    perfect = exposed_tp_s(comm_s=4.0, matmul_s=8.0, tp=4, efficiency=1.0)
    assert exposed_tp_s(comm_s=4.0, matmul_s=8.0, tp=4, efficiency=eta) == pytest.approx(
        perfect + (1 - eta) * (4.0 - perfect)
    )


def test_never_more_than_the_collective_and_nothing_to_hide_without_tp():
    assert exposed_tp_s(comm_s=3.0, matmul_s=0.0, tp=8, efficiency=1.0) == pytest.approx(3.0)
    assert exposed_tp_s(comm_s=3.0, matmul_s=100.0, tp=1, efficiency=1.0) == 3.0


def _plan(**changes) -> Plan:
    base = dict(
        devices=8, dp=1, tp=8, pp=1, micro_batch_size=2, num_microbatches=4, sequence_parallel=True, precision="bf16"
    )
    return Plan(**{**base, **changes})


def test_overlap_hides_tp_time_and_charges_the_sliced_matmuls():
    graph, profile = synthetic_gpt(layers=4, hidden=4096, heads=32, seq=2048, batch=8), synthetic_profile()
    model = CostModel(graph, profile)
    plain, hidden = model.estimate(_plan()), model.estimate(_plan(tp_comm_overlap=True))
    assert hidden.tp_comm_s < 0.5 * plain.tp_comm_s
    assert hidden.compute_s > plain.compute_s  # matmuls run as 8 token slices
    assert hidden.compute_s - plain.compute_s < plain.tp_comm_s - hidden.tp_comm_s
    assert hidden.step_time_s < plain.step_time_s
    assert model.estimate(_plan()).step_time_s == plain.step_time_s  # the plain plan is priced as before


def test_on_small_matmuls_slicing_can_cost_more_than_it_hides():
    graph, profile = synthetic_gpt(layers=2, hidden=256, heads=4, seq=64, batch=8), synthetic_profile()
    model = CostModel(graph, profile)
    plain, hidden = (
        model.estimate(_plan(micro_batch_size=1, num_microbatches=8)),
        model.estimate(_plan(micro_batch_size=1, num_microbatches=8, tp_comm_overlap=True)),
    )
    assert hidden.compute_s - plain.compute_s > 0
    stages, _, _ = model.priced_stages(_plan(micro_batch_size=1, num_microbatches=8, tp_comm_overlap=True))
    assert any(b.tp_overlap_chunking_fwd_s > 0 for b in stages[0].blocks)


def test_overlap_needs_sequence_parallelism():
    with pytest.raises(PlanError, match="needs sequence_parallel=true"):
        _plan(sequence_parallel=False, tp_comm_overlap=True)
    plan = _plan(tp_comm_overlap=True)
    assert Plan.from_dict(json.loads(json.dumps(plan.to_dict()))).tp_comm_overlap is True
    assert "tp-overlap" in plan.describe()


def test_the_partition_balances_what_the_cost_model_charges():
    graph, profile = synthetic_gpt(layers=8, hidden=2048, heads=16, seq=1024, batch=16), synthetic_profile()
    search = Search(graph, profile, SearchOptions(devices=16, batch_size=16))
    plan = Plan(
        devices=16,
        dp=1,
        tp=8,
        pp=2,
        micro_batch_size=2,
        num_microbatches=8,
        sequence_parallel=True,
        precision="bf16",
        tp_comm_overlap=True,
        tp_plan=default_tp_plan(graph, 8, sequence_parallel=True),
    )
    stages = search._stages(plan)
    times, _ = search.stage_costs.stage_totals(plan, stages)
    priced, _, _ = search.cost_model.priced_stages(replace(plan, stages=stages))
    assert times == pytest.approx([s.micro_batch_s for s in priced], rel=1e-12)


def test_the_search_offers_overlap_on_gpus_and_never_on_gloo():
    graph = synthetic_gpt(layers=4, hidden=4096, heads=32, seq=2048, batch=16)
    gpu = plan_graph(graph, devices=8, profile=synthetic_profile(), batch_size=16, fix="tp=8,sp=on")
    assert {c.config["tp_overlap"] for c in gpu.candidates} >= {True, False}
    assert gpu.best.tp_comm_overlap  # big matmuls at tp=8 hide their collectives
    cpu = plan_graph(graph, devices=2, profile=load_profile("cpu-gloo"), batch_size=16, fix="tp=2,sp=on")
    assert all(c.config["tp_overlap"] in (False, "*") for c in cpu.candidates)
    with pytest.raises(PlanError, match="tp_overlap=on needs an NCCL"):
        plan_graph(graph, devices=2, profile=load_profile("cpu-gloo"), batch_size=16, fix="tp=2,sp=on,tp_overlap=on")


def test_a_cpu_refuses_the_plan_in_one_sentence(tmp_path):
    plan = Plan(
        devices=2,
        dp=1,
        tp=2,
        pp=1,
        micro_batch_size=2,
        num_microbatches=1,
        sequence_parallel=True,
        tp_comm_overlap=True,
    )
    with pytest.raises(PlanError, match="needs CUDA devices with NCCL"):
        check_runs_here(plan)
    path = plan.save(tmp_path / "plan.json")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "autoplan.cli",
            "run",
            str(ROOT / "examples/gpt.py"),
            "--plan",
            str(path),
            "--steps",
            "1",
            "--out",
            str(tmp_path / "run"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert "tp_comm_overlap=true" in proc.stderr and "--fix tp_overlap=off" in proc.stderr
    assert not (tmp_path / "run" / "measured.csv").exists()


def test_the_pin_takes_on_or_off_only():
    from autoplan.solve.pins import parse_fixes

    assert parse_fixes("tp_overlap=on") == {"tp_overlap": True}
    assert parse_fixes("tp_overlap=off") == {"tp_overlap": False}
    with pytest.raises(PlanError, match="--fix tp_overlap=maybe is not valid; expected on or off"):
        parse_fixes("tp_overlap=maybe")
