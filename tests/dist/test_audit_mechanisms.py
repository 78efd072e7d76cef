"""What particular audited cases show (tests/dist/audit_cases.py, run once a session by tests/dist/conftest.py):
recomputation re-runs the forward matmuls it is priced for, activation offload moves the bytes it is priced for,
compiled blocks generate the fused kernels the price assumes, the busiest expert-parallel rank peaks as priced at the
measured imbalance, a sparse embedding's rows lie within the estimate's bound, and the executor's in-place reshards
are counted as unpriced; and Hugging Face Mixtral through `autoplan run --verify --audit`."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

import pytest
from audit_cases import comm_of, predictions, priced_case, priced_profile
from exec_harness import make_plan

from autoplan.cost.dp.sparse_embedding import INDEX_BYTES, distinct_rows_sd, reads_per_rank, sparse_tables
from autoplan.cost.model import CostModel
from autoplan.execute.job.audit import audit_rows
from autoplan.execute.job.routing_audit import measured_imbalance
from autoplan.types.moe import RoutingModel
from autoplan.types.plan import Plan

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


def test_compiled_blocks_generate_the_priced_fused_kernels(audits, graphs):
    """TinyGPT's compiled block: inductor's C++ backend generates one forward kernel per fused region
    the price assumes (ln_1 | residual add + ln_2 | gelu | residual add: cost/compute/fusion.py), once
    for the four identical blocks; audit.csv carries both counts. The backward's kernels are reported
    beside the same count (inductor adds bias-gradient sums and the qkv split's copy)."""
    plan, predicted = predictions(graphs, "ddp_compile")
    ranks = audits["ddp_compile"]["ranks"]
    rows = audit_rows(ranks=ranks, predictions=predicted, stage_peak_bytes=[0.0] * len(predicted))
    forward = [r for r in rows if r["what"] == "fused kernels forward"]
    assert predicted[0].fused_regions == 4 and len(forward) == len(ranks) == 2
    assert all(r["measured"] == r["predicted"] == 4 and r["as_priced"] for r in forward), forward
    assert all(rank["fused_kernels"][1] >= 4 for rank in ranks)
    assert not any(
        r["what"].startswith("fused")
        for r in audit_rows(
            ranks=audits["ddp"]["ranks"], predictions=predictions(graphs, "ddp")[1], stage_peak_bytes=[0.0]
        )
    )


def test_the_busiest_ep_rank_peaks_as_priced_at_the_measured_imbalance(audits, graphs):
    """SkewedMoE at dp = ep = 2: the audit reports the rows each rank's experts received (routing_audit.py); their
    max over the mean is the run's imbalance, well above the default model's 1.25; priced again at it, the
    busiest rank's peak (its expert activations that many times the mean, cost/blocks.py) is within 10%, where
    the balanced price is not, and the other rank's within 10% of the balanced one."""
    ranks = audits["moe_ep_skewed"]["ranks"]
    assert "error" not in audits["moe_ep_skewed"], audits["moe_ep_skewed"].get("error")
    imbalance = measured_imbalance(ranks)[0]
    assert imbalance > 1.5, [r["expert_rows"] for r in ranks]
    received = [r for r in audit_rows(ranks=ranks, predictions=predictions(graphs, "moe_ep_skewed")[1],
                                      stage_peak_bytes=[0.0]) if r["what"] == "expert rows received"]  # fmt: skip
    assert max(r["measured"] / r["predicted"] for r in received) == pytest.approx(imbalance)
    busiest, other = sorted(ranks, key=lambda r: -r["expert_rows"])
    peak = {}
    for i in (1.0, imbalance):
        plan = make_plan("moe_skewed", dp=2, ep=2, routing=RoutingModel(imbalance=i))
        model = CostModel(graphs["moe_skewed"], priced_profile())
        peak[i] = model.stage_memory(plan, model.priced_stages(plan)[0])[0].peak_bytes
    assert busiest["peak_live_bytes"] == pytest.approx(peak[imbalance], rel=0.10), (busiest["peak_live_bytes"], peak)
    assert busiest["peak_live_bytes"] > peak[1.0] * 1.10 and other["peak_live_bytes"] == pytest.approx(
        peak[1.0], rel=0.10
    )


def test_sparse_embedding_rows_within_the_estimates_bound(audits, graphs):
    """The dense buckets' all-reduce is byte for byte the priced one without the table; the rows each rank
    touched (recorded in audit.csv as "comm dp touched_rows") lie within 4 standard deviations of U, and
    the two all-gathers carry p times those rows' indices and values (cost/dp/sparse_embedding.py)."""
    result = audits["ddp_sparse_embedding"]
    assert "error" not in result, result.get("error")
    plan, predicted = predictions(graphs, "ddp_sparse_embedding")
    [table] = sparse_tables(graphs["gpt_sparse"])
    reads = reads_per_rank(table, plan)
    expected, sd = table.rows_per_rank(reads), distinct_rows_sd(table.rows, reads)
    priced = predicted[0].comm
    for rank in result["ranks"]:
        measured = comm_of(rank)
        assert set(measured) == set(priced), f"collectives {sorted(measured)} run, {sorted(priced)} priced"
        assert measured[("dp", "all_reduce")][1] == priced[("dp", "all_reduce")][1]
        count, rows = measured[("dp", "touched_rows")]
        assert count == 1 and rows <= min(reads, table.rows) and abs(rows - expected) <= 4 * sd, (rows, expected, sd)
        row_bytes = table.dim * table.value_bytes + INDEX_BYTES
        assert measured[("dp", "all_gather")] == [2, plan.dp * rows * row_bytes]
        assert priced[("dp", "all_gather")][1] == pytest.approx(plan.dp * expected * row_bytes, rel=1e-9)


def test_recomputation_runs_what_it_is_priced_for(audits):
    plain = audits["ddp"]["ranks"][0]
    full, selective = audits["recompute_full"]["ranks"][0], audits["recompute_selective"]["ranks"][0]
    assert full["forward_flops"] == plain["forward_flops"]
    # full re-runs the blocks' forward matmuls inside the backward; selective keeps matmul outputs
    assert full["backward_flops"] > plain["backward_flops"] * 1.2
    assert selective["backward_flops"] == plain["backward_flops"]
    assert full["peak_live_bytes"] < plain["peak_live_bytes"]
    # half the blocks recomputed re-run half the forward matmuls: between none and every block
    half = audits["recompute_budget_full"]["ranks"][0]
    rerun, rerun_half = (
        full["backward_flops"] - plain["backward_flops"],
        half["backward_flops"] - plain["backward_flops"],
    )
    assert rerun_half == pytest.approx(rerun / 2, rel=1e-9)
    assert full["peak_live_bytes"] < half["peak_live_bytes"] < plain["peak_live_bytes"]


def test_activation_offload_moves_what_it_is_priced_for(audits):
    """The copies out and back are the same bytes, and the device's peak falls below the same plan's without."""
    plain, offloaded = audits["ddp"]["ranks"][0], audits["offload_activations"]["ranks"][0]
    rows = {kind: size for dim, kind, _count, size in offloaded["comm"] if dim == "host"}
    assert rows["act_d2h"] == rows["act_h2d"] > 0
    assert offloaded["peak_live_bytes"] < plain["peak_live_bytes"]
    assert offloaded["backward_flops"] == plain["backward_flops"]  # nothing recomputed


def _audit_rows(audits, graphs, name):
    _plan, predicted, peaks = priced_case(graphs, name)
    return audit_rows(ranks=audits[name]["ranks"], predictions=predicted, stage_peak_bytes=peaks)


def test_the_audit_counts_in_place_reshards_as_unpriced(audits, graphs):
    """The executor's in-place fallback (execute/dtensor_handlers.py) all-gathers what the plan
    priced as sharded: the audit's "in-place reshards" row says how often, never as priced; a
    plan without it has the row at 0, as priced."""
    assert "error" not in audits["tp_inplace_reshard"], audits["tp_inplace_reshard"].get("error")
    reshards = [r for r in _audit_rows(audits, graphs, "tp_inplace_reshard") if r["what"] == "in-place reshards"]
    assert len(reshards) == 2 and all(r["measured"] > 0 and not r["as_priced"] for r in reshards)
    clean = [r for r in _audit_rows(audits, graphs, "tp_gqa") if r["what"] == "in-place reshards"]
    assert len(clean) == 2 and all(r["measured"] == 0 and r["as_priced"] for r in clean)


def test_mixtral_under_sequence_parallelism_runs_as_priced(tmp_path):
    """Hugging Face Mixtral (grouped expert GEMMs) at tp=2 with SP and selective recomputation,
    through `autoplan run --verify --audit`: the MoE blocks run on each rank's sequence shard, so
    every collective is as priced (count and bytes), the backward does not re-run the grouped
    GEMMs (matmul FLOPs as priced), peak memory is within 10%, and the step matches the reference."""
    pytest.importorskip("transformers")
    sizes = dict(LAYERS=2, DIM=64, HEADS=4, FFN=128, EXPERTS=4, VOCAB=512, SEQ=32)
    env = {**os.environ, **{f"AUTOPLAN_HF_MIXTRAL_{k}": str(v) for k, v in sizes.items()}}
    model = ROOT / "examples" / "hf_mixtral.py"
    plan = Plan(devices=2, dp=1, tp=2, pp=1, sequence_parallel=True, recompute="selective", micro_batch_size=2,
                num_microbatches=2, stages=[["model.layers.0", "model.layers.1"]], routing=RoutingModel(),
                profile="cpu-gloo")  # fmt: skip
    plan_file = str(plan.save(tmp_path / "plan.json"))
    command = [sys.executable, "-m", "autoplan.cli", "run", str(model), "--plan", plan_file,
               "--steps", "2", "--verify", "--audit", "--out", str(tmp_path / "run")]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=ROOT, env=env)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "verify: PASSED" in result.stdout
    rows = list(csv.DictReader((tmp_path / "run" / "audit.csv").open()))
    comm = [r for r in rows if r["what"].startswith("comm")]
    assert comm and all(r["as_priced"] == "True" for r in comm), [r for r in comm if r["as_priced"] != "True"]
    flops = [r for r in rows if "matmul FLOPs" in r["what"]]
    assert len(flops) == 4 and all(r["as_priced"] == "True" for r in flops), flops
    memory = [abs(float(r["relative_error"])) for r in rows if r["what"] == "peak live memory"]
    assert len(memory) == 2 and max(memory) <= 0.10, memory
