"""DualPipeV's F&B pairs with the EP all-to-all overlapped (cost/moe/a2a_overlap.py): the paired share read from
the V order, and DeepSeek-V3's whole-run check plan (benchmarks/whole_run_hours.py) priced on a small MoE graph."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest
from synthetic.moe import mixtral_graph

from autoplan.cost.model import CostModel
from autoplan.cost.moe.a2a_overlap import block_exposed_s, paired_share
from autoplan.report.moe_overlap import a2a_overlap_why
from autoplan.types.moe_overlap import overlap_refusal

pytest.importorskip("transformers")
BENCHMARKS = Path(__file__).resolve().parents[3] / "benchmarks"


@pytest.mark.parametrize(("rank", "pairs"), [(0, 5), (1, 6), (2, 7), (3, 7)])
def test_dualpipevs_paired_share_is_its_orders_f_and_b_pairs_per_rank(rank, pairs):
    """p = 4, m = 8: rank r runs 2m - 3p + r + 1 F&B pairs (the last rank one fewer: its first runs apart) of its
    2m chunk forwards; Megatron's warm-up count (2(p - 1) + p + 1 alone at v = 2) says 5 on every rank."""
    share = paired_share(num_microbatches=8, pp=4, virtual_stages=2, schedule="dualpipev", rank=rank)
    assert share == pytest.approx(pairs / 16)


def test_zbv_runs_no_pairs_so_nothing_of_its_all_to_all_is_hidden():
    assert paired_share(num_microbatches=8, pp=4, virtual_stages=2, schedule="zbv", rank=0) == 0.0
    assert paired_share(num_microbatches=8, pp=4, virtual_stages=2) == pytest.approx(5 / 16)  # Megatron's, as before


@pytest.fixture(scope="module")
def check():
    """benchmarks/whole_run_hours.py, the whole-run check."""
    sys.path.insert(0, str(BENCHMARKS))
    try:
        import whole_run_hours
    finally:
        sys.path.remove(str(BENCHMARKS))
    return whole_run_hours


@pytest.fixture(scope="module")
def model(check):
    return CostModel(mixtral_graph(), check.h800_profile())  # the check's H800 profile, FP8 peak included


@pytest.fixture(scope="module")
def check_plan(check, model):
    """The whole-run check's DeepSeek-V3 plan (its CSV row) at 8 devices and 8 micro-batches on the small graph."""
    runs = pd.read_csv(BENCHMARKS / "whole_run_hours.csv")
    row = runs[runs.run == "deepseek-v3-pretrain"].iloc[0].copy()
    row[["devices", "pp", "dp", "ep", "global_batch"]] = [8, 2, 4, 4, 32]
    return check.published_plan(row, model.graph)


def test_the_checks_plan_is_dualpipev_with_the_overlap_in_fp8_which_autoplan_runs_with_selective_recompute(check_plan):
    plan = check_plan
    assert (plan.schedule, plan.virtual_stages, plan.num_microbatches) == ("dualpipev", 2, 8)
    assert plan.moe_a2a_overlap and (plan.precision, plan.fp8_recipe) == ("fp8", "rowwise")
    # autoplan's executor runs DualPipeV's pairs overlapped (execute/overlap_f_b.py), beside selective recomputation
    # too (a re-run block keeps its all-to-alls' outputs), not beside ZeRO-2's collectives inside the halves
    assert plan.recompute == "selective" and overlap_refusal(plan) == ""
    assert overlap_refusal(replace(plan, recompute="none")) == ""
    assert "zero_stage=2" in overlap_refusal(replace(plan, zero_stage=2))
    assert "1F1B only" in overlap_refusal(replace(plan, runtime="megatron", fp8_recipe=""))


def test_explain_names_dualpipevs_pairs_and_whether_the_executor_runs_them(model, check_plan):
    refused = replace(check_plan, zero_stage=2)
    why = a2a_overlap_why(model, refused, model.estimate(refused))
    assert "DualPipeV's F&B pairs, priced only: autoplan's executor" in why and "Megatron" not in why
    why = a2a_overlap_why(model, check_plan, model.estimate(check_plan))
    assert "DualPipeV's F&B pairs, run by autoplan's executor" in why


def test_the_checks_pairs_expose_only_what_their_compute_leaves(model, check_plan):
    """ep_comm_s = m ep_s less, on the slowest stage's rank, its F&B pairs' share of what each block's pair hides."""
    exposed, overlapped = model.estimate(replace(check_plan, moe_a2a_overlap=False)), model.estimate(check_plan)
    stages, _, _ = model.priced_stages(check_plan)
    rank = max(range(len(stages)), key=lambda s: stages[s].micro_batch_s)
    blocks = [b for b in stages[rank].blocks if b.ep_fwd_s > 0]
    hidden_per_micro_batch_s = sum(b.ep_fwd_s + b.ep_bwd_s - block_exposed_s(b) for b in blocks)
    share = paired_share(num_microbatches=8, pp=2, virtual_stages=2, schedule="dualpipev", rank=rank)
    assert 0 < share < 1 and hidden_per_micro_batch_s > 0
    expected_hidden_s = 8 * share * hidden_per_micro_batch_s
    assert exposed.ep_comm_s - overlapped.ep_comm_s == pytest.approx(expected_hidden_s, rel=1e-9)
    assert overlapped.bubble_s == exposed.bubble_s and overlapped.compute_s == exposed.compute_s
    zbv = replace(check_plan, schedule="zbv")  # no pairs in ZBV's order: all of it stays exposed
    assert model.estimate(zbv).ep_comm_s == model.estimate(replace(zbv, moe_a2a_overlap=False)).ep_comm_s
