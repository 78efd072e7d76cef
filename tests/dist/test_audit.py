"""The execution audit, case by case: on real gloo groups, the collectives each rank issues in one step equal,
count for count and byte for byte, what autoplan/cost/volumes.py predicts from the cost model's own stage totals;
parameters held per rank match the plan's shards; each rank runs the priced matmul and attention FLOPs; and each
stage's peak of live tensor bytes is within 10% of the priced peak (docs/cost-model.md, "The execution audit").
The cases and their runs: tests/dist/audit_cases.py, tests/dist/conftest.py; what particular cases show (the
recomputation, offload, compiled kernels, routing): tests/dist/test_audit_mechanisms.py."""

from __future__ import annotations

import pytest
from audit_cases import CASES, FLOPS_ONLY, FOUR, SPARSE, comm_of, predictions, priced_case

from autoplan.cost.dp.compression import traffic_of

pytestmark = pytest.mark.slow

#: collectives whose bytes on one rank follow the real routing under ep > 1 (the rows its ep peers send it), priced
#: under balanced routing: as many as priced on every rank, their bytes summed over the ranks exact
ROUTED = {("ep", "all_to_all"), ("etp", "all_to_all")}


@pytest.mark.parametrize("name", [c[0] for c in CASES + FOUR])
def test_collectives_equal_the_priced_volumes(audits, graphs, name):
    result = audits[name]
    assert "error" not in result, result.get("error")
    plan, predicted = predictions(graphs, name)
    routed = ROUTED if plan.ep > 1 else set()
    summed: dict[tuple, list[float]] = {key: [0.0, 0.0] for key in routed}
    for rank in result["ranks"]:
        expected = predicted[rank["stage"]].comm
        measured = comm_of(rank)
        assert set(measured) == set(expected), f"{name}: collectives {sorted(measured)} run, {sorted(expected)} priced"
        for key, (count, size) in expected.items():
            if key in routed:
                summed[key] = [summed[key][0] + measured[key][1], summed[key][1] + size]
            else:
                assert measured[key][1] == pytest.approx(size, rel=1e-9), (
                    f"{name} {key}: {measured[key][1]} bytes run, {size} priced"
                )
            if count is not None:
                assert measured[key][0] == count, f"{name} {key}: {measured[key][0]} collectives run, {count} priced"
    for key, (run, priced) in summed.items():
        assert run == pytest.approx(priced, rel=1e-9), f"{name} {key}: {run} bytes run over the ranks, {priced} priced"


@pytest.mark.parametrize("name", [c[0] for c in CASES + FOUR + SPARSE])
def test_each_rank_holds_the_priced_parameter_shard(audits, graphs, name):
    plan, predicted = predictions(graphs, name)
    for rank in audits[name]["ranks"]:
        held = rank["placement"]["param_elements"]
        assert held == pytest.approx(predicted[rank["stage"]].param_elements, rel=0.02), name


def _powersgd_flops(graphs, plan) -> float:
    """The PowerSGD hook's three matmuls per compressed matrix (M Q, M^T P, P Q^T), priced as
    compression time (autoplan/cost/dp/compression.py), not as model FLOPs. M Q runs on the
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
#: Families whose experts are written as a loop over ``weight[e]`` (TinyMoE, transformers'
#: eager experts): the backward of each ``weight[e]`` is a whole ``[E, ...]`` zero tensor with one
#: expert's slice filled, summed into the weight's gradient, a transient of a few expert-weight
#: gradients that no plan changes (the same bytes at dp, tp and tp with SP) and that the grouped
#: GEMM the cost model prices does not have. Their memory is held through the user's path on a
#: grouped-GEMM model instead: test_mixtral_under_sequence_parallelism_runs_as_priced.
LOOP_EXPERTS = {
    "moe_tp",
    "moe_tp_sp",
    "moe_tp_sp_recompute_selective",
    "moe_tp_sp_etp",
    "moe_dp_tp_sp_ep_etp",
    "moe_dp_tp_sp_etp_zero1",
}
#: FSDP2 hooks a unit's post-backward on forward inputs that need a gradient; the first block behind
#: a frozen embedding has none, so it stays gathered until the backward's final callback reduces and
#: reshards it. Whether that overlaps the previous unit's asynchronous gloo reduce-scatter is up to
#: thread timing: one rank then peaks a block's gathered weights higher (+4% or +16% of the priced
#: peak in repeated runs, never between). Its stage's lowest peak is held to 10% as every other's.
ASYNC_FINAL_RESHARD = {"frozen_zero3"}
#: Families priced at the routing the run measured, not the plan's: their own test
MEASURED_ROUTING = {"moe_ep_skewed"}


def _routed_flops(name: str, ranks: list[dict], predicted: list) -> None:
    """Under ep > 1 a rank's expert GEMMs run on the rows routed to it: every rank's matmul FLOPs summed equal the
    priced ones summed (balanced routing), as the routed all-to-alls' bytes do (ROUTED)."""
    for key in ("forward_flops", "backward_flops", "attention_forward_flops", "attention_backward_flops"):
        run, priced = sum(r[key] for r in ranks), sum(getattr(predicted[r["stage"]], key) for r in ranks)
        assert run == pytest.approx(priced, rel=1e-9), f"{name} {key}: {run} run over the ranks, {priced} priced"


@pytest.mark.parametrize("name", [c[0] for c in CASES + FOUR + FLOPS_ONLY + SPARSE])
def test_each_rank_computes_the_priced_flops(audits, graphs, name):
    plan, predicted = predictions(graphs, name)
    hook = _powersgd_flops(graphs, plan)
    if plan.ep > 1:
        _routed_flops(name, audits[name]["ranks"], predicted)
        return
    for rank in audits[name]["ranks"]:
        pred = predicted[rank["stage"]]
        assert rank["forward_flops"] == pytest.approx(pred.forward_flops, rel=1e-9), name
        if hook:  # M Q always on the backward's thread; M^T P and P Q^T wherever their future completes
            assert pred.backward_flops + hook / 3 <= rank["backward_flops"] <= pred.backward_flops + hook, name
        else:
            assert rank["backward_flops"] == pytest.approx(pred.backward_flops, rel=1e-9), (
                name
            )  # recomputation included
        assert rank["attention_forward_flops"] == pytest.approx(pred.attention_forward_flops, rel=1e-9), name
        # flash attention's backward recomputes the scores (5 matmuls, priced as cost/compute/roofline.py
        # executed_bwd_flops); full recomputation adds the forward
        assert rank["attention_backward_flops"] == pytest.approx(pred.attention_backward_flops, rel=1e-9), name


@pytest.mark.parametrize(
    "name", [c[0] for c in CASES + FOUR + SPARSE if c[0] not in MEMORY_UNSEEN | LOOP_EXPERTS | MEASURED_ROUTING]
)
def test_each_stage_peaks_within_ten_percent_of_the_priced_memory(audits, graphs, name):
    """The ranks of one stage run the same program; gloo finishes an asynchronous collective (and
    frees what it holds) at a time the scheduler picks, so one rank may peak a few percent above
    the others. The stage's lowest peak is held to 10%, every rank to 15%."""
    priced = priced_case(graphs, name)[2]
    by_stage: dict[int, list[int]] = {}
    for rank in audits[name]["ranks"]:
        by_stage.setdefault(rank["stage"], []).append(rank["peak_live_bytes"])
    for stage, peaks in by_stage.items():
        assert min(peaks) == pytest.approx(priced[stage], rel=0.10), (
            f"{name} stage {stage}: peaks {peaks} bytes live, {priced[stage]:.0f} priced"
        )
        if name not in ASYNC_FINAL_RESHARD:
            assert max(peaks) == pytest.approx(priced[stage], rel=0.15), (
                f"{name} stage {stage}: peaks {peaks} bytes live, {priced[stage]:.0f} priced"
            )
