"""The execution audit: on real gloo groups, the collectives each rank issues in one step equal,
count for count and byte for byte, what autoplan/cost/volumes.py predicts from the cost model's
own stage totals; parameters held per rank match the plan's shards; and recomputation really
re-runs the forward matmuls it is priced for; and each rank's peak of live tensor bytes is within 10% of
the priced peak (docs/cost-model.md, "The execution audit")."""
from __future__ import annotations

import dataclasses

import pytest

import exec_models as m
from exec_harness import make_plan, run_audits

from autoplan.cost.compression import traffic_of
from autoplan.cost.model import CostModel
from autoplan.cost.volumes import predict
from autoplan.profile import load_profile
from autoplan.trace import trace

pytestmark = pytest.mark.slow

CASES = [
    ("ddp", "gpt", dict(dp=2)),
    ("ddp_bf16_reduce", "gpt", dict(dp=2, precision="bf16", grad_reduce_dtype="bf16")),
    ("zero1", "gpt", dict(dp=2, zero_stage=1)),
    ("zero1_llama_m1", "llama", dict(dp=2, zero_stage=1, num_microbatches=1)),
    ("zero2_accumulate", "gpt", dict(dp=2, zero_stage=2)),
    ("zero2_m1", "llama", dict(dp=2, zero_stage=2, num_microbatches=1)),
    ("zero3_accumulate", "gpt", dict(dp=2, zero_stage=3)),
    ("zero3_bf16", "llama", dict(dp=2, zero_stage=3, precision="bf16", num_microbatches=1)),
    ("pp_gpipe", "gpt", dict(pp=2, schedule="gpipe")),
    ("pp_1f1b", "llama", dict(pp=2, schedule="1f1b", num_microbatches=4)),
    ("pp_interleaved", "gpt", dict(pp=2, schedule="interleaved_1f1b", virtual_stages=2, num_microbatches=4)),
    ("recompute_full", "gpt", dict(dp=2, recompute="full")),
    ("recompute_selective", "gpt", dict(dp=2, recompute="selective")),
    ("dp_fp16", "gpt", dict(dp=2, precision="fp16")),
    ("ddp_fp32_bf16_reduce", "gpt", dict(dp=2, grad_reduce_dtype="bf16")),
    ("zero3_fp32_fp16_reduce", "gpt", dict(dp=2, zero_stage=3, grad_reduce_dtype="fp16")),
    ("ddp_powersgd", "gpt", dict(dp=2, grad_compression="powersgd", powersgd_rank=2)),
    ("tp", "gpt", dict(tp=2)),
    ("tp_default_split", "gpt", dict(tp=2, tp_plan={})),
    ("tp_gqa", "llama", dict(tp=2)),
    ("tp_sp", "gpt", dict(tp=2, sequence_parallel=True)),
    ("tp_sp_gqa", "llama", dict(tp=2, sequence_parallel=True)),
    ("tp_recompute_full", "gpt", dict(tp=2, recompute="full")),
    ("tp_sp_recompute_selective", "llama", dict(tp=2, sequence_parallel=True, recompute="selective")),
]
FOUR = [
    ("dp_tp", "gpt", dict(dp=2, tp=2)),
    ("dp_tp_zero1", "llama", dict(dp=2, tp=2, zero_stage=1)),
    ("dp_tp_zero3_sp", "llama", dict(dp=2, tp=2, zero_stage=3, sequence_parallel=True)),
    ("pp_tp", "llama", dict(pp=2, tp=2)),
    ("pp_tp_sp_1f1b", "gpt", dict(pp=2, tp=2, sequence_parallel=True, schedule="1f1b", num_microbatches=4)),
    ("pp_dp_zero2", "gpt", dict(pp=2, dp=2, zero_stage=2)),
    ("pp_dp_zero3_gpipe", "llama", dict(pp=2, dp=2, zero_stage=3, schedule="gpipe")),
    ("pp_dp_interleaved", "gpt", dict(pp=2, dp=2, schedule="interleaved_1f1b", virtual_stages=2, num_microbatches=4)),
]


@pytest.fixture(scope="module")
def audits():
    return {**run_audits(2, CASES), **run_audits(4, FOUR)}


@pytest.fixture(scope="module")
def graphs():
    return {name: trace(getattr(m, cls)(), (m.tokens(2, 1),)) for name, cls in (("gpt", "TinyGPT"), ("llama", "TinyLlama"))}


def _case(name):
    return next((model, kw) for case, model, kw in CASES + FOUR if case == name)


def _predictions(graphs, name):
    model, kw = _case(name)
    plan = make_plan(model, **kw)
    profile = dataclasses.replace(load_profile("cpu-gloo"), devices_per_node=8)   # volumes do not depend on the link
    return plan, predict(CostModel(graphs[model], profile), plan)


def _measured(rank: dict) -> dict:
    return {(dim, kind): [count, size] for dim, kind, count, size in rank["comm"]}


@pytest.mark.parametrize("name", [c[0] for c in CASES + FOUR])
def test_collectives_equal_the_priced_volumes(audits, graphs, name):
    result = audits[name]
    assert "error" not in result, result.get("error")
    plan, predicted = _predictions(graphs, name)
    for rank in result["ranks"]:
        expected = predicted[rank["stage"]].comm
        measured = _measured(rank)
        assert set(measured) == set(expected), f"{name}: collectives {sorted(measured)} run, {sorted(expected)} priced"
        for key, (count, size) in expected.items():
            assert measured[key][1] == pytest.approx(size, rel=1e-9), f"{name} {key}: {measured[key][1]} bytes run, {size} priced"
            if count is not None:
                assert measured[key][0] == count, f"{name} {key}: {measured[key][0]} collectives run, {count} priced"


@pytest.mark.parametrize("name", [c[0] for c in CASES + FOUR])
def test_each_rank_holds_the_priced_parameter_shard(audits, graphs, name):
    plan, predicted = _predictions(graphs, name)
    for rank in audits[name]["ranks"]:
        held = rank["placement"]["param_elements"]
        assert held == pytest.approx(predicted[rank["stage"]].param_elements, rel=0.02), name


def _powersgd_flops(graphs, plan) -> float:
    """The PowerSGD hook's three matmuls per compressed matrix (M Q, M^T P, P Q^T), priced as
    compression time (autoplan/cost/compression.py), not as model FLOPs. M Q runs on the
    backward's thread; the other two run in the callbacks of its all-reduces' futures, on
    whichever thread completes them (gloo's, unseen by a thread-local dispatch mode, or this one
    when the future is already done), so the meter sees between a third and all of them."""
    if plan.grad_compression != "powersgd":
        return 0.0
    shapes = [info.shape for info in graphs["gpt"].parameters.values()]
    return traffic_of(shapes, plan.powersgd_rank).matmul_flops


#: Families whose peak a thread-local meter cannot see whole: PowerSGD's hook allocates its
#: decompressed matrices and new error in future callbacks, on whichever thread completes the
#: all-reduce (see _powersgd_flops), so the measured peak depends on thread timing. Its priced
#: memory is checked through the user's path instead, on a model large enough for the backward's
#: peak to dominate: benchmarks/audit.py's ddp_powersgd row (benchmarks/results/audit.csv).
MEMORY_UNSEEN = {"ddp_powersgd"}


@pytest.mark.parametrize("name", [c[0] for c in CASES + FOUR])
def test_each_rank_computes_the_priced_flops(audits, graphs, name):
    plan, predicted = _predictions(graphs, name)
    hook = _powersgd_flops(graphs, plan)
    for rank in audits[name]["ranks"]:
        pred = predicted[rank["stage"]]
        assert rank["forward_flops"] == pytest.approx(pred.forward_flops, rel=1e-9), name
        if hook:  # M Q always on the backward's thread; M^T P and P Q^T wherever their future completes
            assert pred.backward_flops + hook / 3 <= rank["backward_flops"] <= pred.backward_flops + hook, name
        else:
            assert rank["backward_flops"] == pytest.approx(pred.backward_flops, rel=1e-9), name   # recomputation included
        assert rank["attention_forward_flops"] == pytest.approx(pred.attention_forward_flops, rel=1e-9), name
        # flash attention's backward recomputes the scores (5 matmuls, priced as cost/compute.py
        # executed_bwd_flops); full recomputation adds the forward
        assert rank["attention_backward_flops"] == pytest.approx(pred.attention_backward_flops, rel=1e-9), name


@pytest.mark.parametrize("name", [c[0] for c in CASES + FOUR if c[0] not in MEMORY_UNSEEN])
def test_each_stage_peaks_within_ten_percent_of_the_priced_memory(audits, graphs, name):
    """The ranks of one stage run the same program; gloo finishes an asynchronous collective (and
    frees what it holds) at a time the scheduler picks, so one rank may peak a few percent above
    the others. The stage's lowest peak is held to 10%, every rank to 15%."""
    model, kw = _case(name)
    plan = make_plan(model, **kw)
    cost_model = CostModel(graphs[model], dataclasses.replace(load_profile("cpu-gloo"), devices_per_node=8))
    stages, _tp_plan, _ctx = cost_model.priced_stages(plan)
    priced = [memory.peak_bytes for memory in cost_model.stage_memory(plan, stages)]
    by_stage: dict[int, list[int]] = {}
    for rank in audits[name]["ranks"]:
        by_stage.setdefault(rank["stage"], []).append(rank["peak_live_bytes"])
    for stage, peaks in by_stage.items():
        assert min(peaks) == pytest.approx(priced[stage], rel=0.10), f"{name} stage {stage}: peaks {peaks} bytes live, {priced[stage]:.0f} priced"
        assert max(peaks) == pytest.approx(priced[stage], rel=0.15), f"{name} stage {stage}: peaks {peaks} bytes live, {priced[stage]:.0f} priced"


def test_recomputation_runs_what_it_is_priced_for(audits):
    plain = audits["ddp"]["ranks"][0]
    full, selective = audits["recompute_full"]["ranks"][0], audits["recompute_selective"]["ranks"][0]
    assert full["forward_flops"] == plain["forward_flops"]
    # full re-runs the blocks' forward matmuls inside the backward; selective keeps matmul outputs
    assert full["backward_flops"] > plain["backward_flops"] * 1.2
    assert selective["backward_flops"] == plain["backward_flops"]
    assert full["peak_live_bytes"] < plain["peak_live_bytes"]
