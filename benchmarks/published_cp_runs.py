"""Predict published long-context runs with context parallelism on H100s, with the shipped dgx-h100 profile.

benchmarks/published_cp_runs.csv lists the runs, each with its source (file and commit, or paper table)
and notes: torchtitan's Llama 3.1 8B on 8 H100s at 32K-256K tokens with FSDP x CP, its 405B on 512
H100s at TP 8 PP 8 with CP 1-8, and Llama 3 405B on 16,384 H100s at TP 8 PP 16 with CP 1 (8K tokens)
and CP 16 (128K tokens). For each row this script traces the Llama shape (examples/llama.py: RMSNorm,
SwiGLU, rotary, GQA whose K/V are repeated to every head before causal SDPA, as torchtitan's Llama 3
did) on the meta device, pins the published layout with ``Plan(...)`` and predicts tokens/s per GPU
(model TFLOP/s per GPU where only that is published). Nothing is fitted on these runs.

How each layout is pinned: dp, cp, tp, pp, the local batch (global batch = dp x local batch: cp ranks
share their samples) and the micro-batch as the CSV gives them; FSDP as ZeRO-3 (torchtitan shards over
dp x cp), Llama 3's FSDP that keeps the weights between forward and backward as ZeRO-2; cp_variant
allgather (torchtitan's default rotate method in 2024 and Llama 3's choice); Float8 as precision fp8;
the runtime that ran it (the CSV's ``runtime`` and ``compile`` columns, _results.runtime_fields):
torchtitan's rows as ``torchtitan`` with torch.compile (its tables 2 and 6 name it), Meta's Llama 3
framework, which has no preset, as ``autoplan``.
A schedule or recomputation the source does not publish ("search" in the CSV: Llama 3's) is the
planner's pick with every published choice pinned. Llama 3's own pipeline schedule is not expressible:
it interleaves 126 layers over 16 stages unevenly (the first and last stage one layer short), and
autoplan's interleaved schedule needs pp x v to divide the layers.

Then the planner is asked twice for each row's devices, global batch and precision: free, and pinned to
cp = 1. ``gain_cp`` is the best plan's tokens/s over the best cp = 1 plan's ("no cp=1 fit" where none
fits): what the planner predicts CP is worth. The 16,384-GPU searches are skipped with ``--quick``.

    python benchmarks/published_cp_runs.py [--only NAME_SUBSTRING] [--quick]
"""

from __future__ import annotations

import argparse
import statistics
import time
from functools import partial
from pathlib import Path

import pandas as pd
from _results import predict_published, runtime_fields, write_results

from autoplan.cost import CostModel
from autoplan.jobs.environ import environment
from autoplan.profile import load_profile
from autoplan.solve.api import NoPlanFits, plan_graph
from autoplan.trace import trace_model_file
from autoplan.types import Plan

HERE = Path(__file__).parent
LLAMA = HERE.parent / "examples" / "llama.py"
#: the CSV's shape columns -> examples/llama.py's AUTOPLAN_LLAMA_* overrides
SHAPE = {
    "layers": "N_LAYERS",
    "dim": "DIM",
    "heads": "N_HEADS",
    "kv_heads": "N_KV_HEADS",
    "ffn": "FFN_DIM",
    "vocab": "VOCAB_SIZE",
    "seq_len": "SEQ_LEN",
}
#: a schedule or recompute cell the source does not publish: the planner picks it (pinned_plan)
SEARCHED = "search"
#: searches above this many devices are skipped with --quick
QUICK_DEVICES = 1024


def published_plan(row: pd.Series) -> Plan:
    dp, mbs = int(row["dp"]), int(row["micro_batch"])
    return Plan(
        devices=int(row["gpus"]),
        dp=dp,
        cp=int(row["cp"]),
        cp_variant="allgather",
        tp=int(row["tp"]),
        pp=int(row["pp"]),
        micro_batch_size=mbs,
        num_microbatches=int(row["local_batch"]) // mbs,
        schedule=row["schedule"],
        zero_stage=int(row["zero_stage"]),
        recompute=row["recompute"],
        sequence_parallel=int(row["tp"]) > 1,
        precision=row["precision"],
        profile="dgx-h100",
        **runtime_fields(row, zero_stage=int(row["zero_stage"])),
    )


def traced(row: pd.Series, graphs: dict):
    """The row's Llama shape traced at micro-batch 1 (the cost model scales it), shared between rows."""
    pairs = tuple((f"AUTOPLAN_LLAMA_{SHAPE[k]}", str(int(row[k]))) for k in SHAPE)
    if pairs not in graphs:
        start = time.perf_counter()
        with environment(pairs):
            graphs[pairs] = trace_model_file(LLAMA, 1)
        print(f"  traced {row['model']} at {int(row['seq_len'])} tokens in {time.perf_counter() - start:.1f} s")
    return graphs[pairs]


def rates(cost, plan: Plan, seq_len: int) -> tuple[float, float]:
    """(tokens/s per GPU, model TFLOP/s per GPU) of a priced plan."""
    tokens = plan.global_batch_size * seq_len
    seconds = cost.step_time_s * plan.devices
    return tokens / seconds, cost.extra["model_flops"] / seconds / 1e12


def best_tokens(graph, row: pd.Series, profile, fix: dict) -> tuple[float | None, str, float]:
    """The planner's best plan for the row's devices, batch and precision: (tokens/s/GPU, plan, search s)."""
    start = time.perf_counter()
    batch = int(row["dp"]) * int(row["local_batch"])
    try:
        result = plan_graph(
            graph,
            devices=int(row["gpus"]),
            profile=profile,
            batch_size=batch,
            fix={"precision": row["precision"], **fix},
            allow_fp8=row["precision"] == "fp8",
        )
    except NoPlanFits:
        return None, "none fits", time.perf_counter() - start
    tokens, _ = rates(result.best_cost, result.best, int(row["seq_len"]))
    return tokens, result.best.describe(), time.perf_counter() - start


def pinned_plan(row: pd.Series, graph, profile) -> Plan:
    """The published plan; where the source leaves the schedule or recomputation unpublished ("search"
    in the CSV), the planner picks them with every published choice pinned (nothing is fitted), or
    the most frugal such plan when none fits."""
    if SEARCHED not in (row["schedule"], row["recompute"]):
        return published_plan(row)
    published = {k: row[k] for k in ("dp", "cp", "tp", "pp", "zero_stage", "precision")}
    fix = {**{k.removesuffix("_stage"): v for k, v in published.items()}, "mbs": row["micro_batch"]}
    fix["cp_variant"] = "allgather"
    fix.update({k: row[k] for k in ("schedule", "recompute") if row[k] != SEARCHED})
    batch = int(row["dp"]) * int(row["local_batch"])
    try:
        return plan_graph(graph, devices=int(row["gpus"]), profile=profile, batch_size=batch, fix=fix).best
    except NoPlanFits as failed:  # the most frugal plan priced, which the row then reports as not fitting
        return min((c for c in failed.result.candidates if c.cost), key=lambda c: c.cost.peak_memory_bytes).plan


def predict(row: pd.Series, profile, graphs: dict, *, search_devices: float = float("inf")) -> dict:
    """The published plan priced, and (on at most ``search_devices`` GPUs) the planner's best with and without cp."""
    graph = traced(row, graphs)
    plan = pinned_plan(row, graph, profile)
    cost = CostModel(graph, profile).estimate(plan)
    tokens, tflops = rates(cost, plan, int(row["seq_len"]))
    by_tokens = not pd.isna(row["published_tokens_per_s_per_gpu"])
    published = float(row["published_tokens_per_s_per_gpu"] if by_tokens else row["published_tflops_per_gpu"])
    predicted = tokens if by_tokens else tflops
    out = {
        "name": row["name"],
        "plan": plan.describe(),
        "metric": "tokens/s/GPU" if by_tokens else "model TFLOP/s/GPU",
        "published": published,
        "predicted": predicted,
        "error": predicted / published - 1.0,
        "step_s": cost.step_time_s,
        "compute_s": cost.compute_s,
        "cp_s": cost.cp_comm_s,
        "tp_s": cost.tp_comm_s,
        "zero_s": cost.zero_comm_s,
        "bubble_s": cost.bubble_s,
        "peak_GiB": cost.peak_memory_bytes / 2**30,
        "published_GiB": row["published_memory_gib"],
        "fits": cost.feasible,
        "predicted_tokens": tokens,
        "predicted_tflops": tflops,
    }
    if int(row["gpus"]) <= search_devices:
        free, free_plan, free_s = best_tokens(graph, row, profile, {})
        flat, flat_plan, flat_s = best_tokens(graph, row, profile, {"cp": 1})
        out.update(
            best_plan=free_plan,
            best_tokens=free,
            best_cp1_plan=flat_plan,
            best_cp1_tokens=flat,
            gain_cp=(free / flat) if free and flat else ("no cp=1 fit" if free else ""),
            search_s=free_s,
            search_cp1_s=flat_s,
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="run only rows whose name contains this")
    parser.add_argument("--quick", action="store_true", help=f"skip the searches on more than {QUICK_DEVICES} GPUs")
    parser.add_argument("--out", default=None, help="CSV path (default benchmarks/results/published_cp_runs.csv)")
    args = parser.parse_args()
    runs = pd.read_csv(HERE / "published_cp_runs.csv")
    profile = load_profile("dgx-h100")
    limit = QUICK_DEVICES if args.quick else float("inf")
    price = partial(predict, search_devices=limit)
    table = predict_published(runs, only=args.only, why_left_out=lambda row: "", predict=price, profile=profile)
    if table.empty:
        return
    print(f"median |error| {100 * statistics.median(abs(e) for e in table['error']):.1f}% over {len(table)} runs")
    write_results(table, "published_cp_runs", path=args.out)


if __name__ == "__main__":
    main()
