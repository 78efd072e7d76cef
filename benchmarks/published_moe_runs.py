"""Predict published Mixture-of-Experts training runs on H100s with the shipped dgx-h100 profile.

benchmarks/published_moe_runs.csv lists the runs (each with its source, date and notes). For each
run autoplan can express, this script traces the model at its published size on the meta device
(examples/hf_deepseek_v3.py, hf_qwen3_moe.py, hf_gpt_oss.py, hf_mixtral.py), pins the
published layout with ``Plan(...)`` and predicts tokens/s per GPU (model TFLOP/s per GPU where
only that is published). Nothing is fitted on these runs: the same profile and cost model price
every row, and the constants come from microbenchmarks and datasheets (docs/cost-model.md).

How each layout is pinned, as its software ran it:

- dp = GPUs / (tp pp cp); ep, pp, mbs and the global batch as published; virtual stages v > 1 as
  interleaved 1F1B; FSDP (NeMo AutoModel's FSDP2) as ZeRO-3; Megatron runs without FSDP as
  ZeRO-1 (the distributed optimizer; an assumption the CSV does not state);
- "activation checkpointing on" as full recomputation, Megatron's selective recomputation of
  norms and activations as selective, none as none; bf16, or fp8 for the FP8 rows;
- the runtime that ran it (the CSV's ``runtime`` column, _results.runtime_fields): Megatron-Bridge,
  Megatron-Core and the Megatron-MoE model zoo as ``megatron`` (the distributed optimizer's
  parameter all-gather overlapped); NeMo AutoModel, PyTorch-native FSDP2 with fused attention and
  no torch.compile, as ``torchtitan``, the preset with those switches; DeepSeek-V3's own
  framework has no preset and is priced as ``autoplan``;
- gradient accumulation: NeMo AutoModel accumulates over GA torch schedule steps of (local batch / mbs)
  micro-batches each (its notes print "LBS 8, GA 4"; the CSV's ``ga`` column), priced as ``schedule_steps`` = GA
  where it runs a pipeline (docs/cost-model.md, "Schedule steps"); Megatron's GA is its micro-batches of one
  schedule, as is any GA without a pipeline;
- routing: every NVIDIA row forces balanced routing for benchmarking ("force-balance", "fake
  balanced gate"), so the routing model's imbalance is 1 for them.

Each row is priced for the runtime that ran it (``Plan.runtime``, docs/cost-model.md "Runtimes"):
Megatron-Core / Megatron-Bridge rows as ``megatron``, NeMo AutoModel rows (FSDP2, TE attention) as
``torchtitan``. Both bring their own fused attention, so GPT-OSS's eager attention with sinks (what
transformers runs) is priced as one fused causal kernel (cost/compute/eager_attention.py), its
128-token sliding window on half its layers read from the traced modules (trace/windows.py).

FP8 rows (Megatron's per-tensor current scaling) are priced at precision "fp8" with Transformer
Engine's current-scaling recipe (``te_current``, docs/cost-model.md "FP8 recipes"): its linears and,
under the megatron runtime, the routed experts' grouped GEMMs run in FP8, as Transformer Engine ran
them (cost/compute/fp8.py ``FP8_EXPERT_RUNTIMES``). Until 2026-12 the experts stayed bf16 and these
rows were priced but not comparable.

A row whose notes say it overlapped the EP all-to-all (the Megatron-MoE model zoo's Qwen3-235B pair, "1F1B EP
all-to-all overlap") is priced with ``moe_a2a_overlap`` (docs/cost-model.md, "EP all-to-all overlap").

Rows with tp > 1 beside ep run Megatron-Core's MoE Parallel Folding (docs/moe.md, "Expert tensor
parallelism"): sequence parallelism on (Megatron-Core refuses MoE at tp > 1 without it in training) and
the CSV's etp as ``expert_tp``; where the table leaves etp blank, 1 (an assumption: Megatron-Bridge's
MoE recipes set ``expert_tensor_parallel_size = 1``, which the tables do not print).

Rows left out, with the reason printed: GPUs without a shipped profile (H800), blockwise FP8
scaling (DeepSeek-V3's own recipe), and rows whose expert parallelism is not published.

    python benchmarks/published_moe_runs.py [--only NAME_SUBSTRING]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import pandas as pd
from _results import predict_published, runtime_fields, write_results

from autoplan.calibrate.runs import environment
from autoplan.cost import CostModel
from autoplan.profile import load_profile
from autoplan.trace import trace_model_file
from autoplan.types import Plan
from autoplan.types.moe import RoutingModel
from autoplan.types.schedules import TORCH_PIPELINES

HERE = Path(__file__).parent
EXAMPLES = HERE.parent / "examples"
#: models whose Hugging Face code is not the code the published runs ran (module docstring)
NOT_COMPARABLE: dict[str, str] = {}
#: the runtime each source's software is (module docstring), by the row name's prefix
#: model column -> (example file, environment that sets its published size)
MODELS = {
    "DeepSeek-V3": ("hf_deepseek_v3.py", {}),
    "Qwen3-30B-A3B": ("hf_qwen3_moe.py", {}),
    "Qwen3-235B-A22B": (
        "hf_qwen3_moe.py",
        {  # Qwen3-235B-A22B's released config.json (huggingface.co/Qwen/Qwen3-235B-A22B; Qwen3 report, Table 2)
            "AUTOPLAN_HF_QWEN3_MOE_LAYERS": "94",
            "AUTOPLAN_HF_QWEN3_MOE_DIM": "4096",
            "AUTOPLAN_HF_QWEN3_MOE_HEADS": "64",
            "AUTOPLAN_HF_QWEN3_MOE_KV_HEADS": "4",
            "AUTOPLAN_HF_QWEN3_MOE_HEAD_DIM": "128",
            "AUTOPLAN_HF_QWEN3_MOE_MOE_FFN": "1536",
            "AUTOPLAN_HF_QWEN3_MOE_EXPERTS": "128",
            "AUTOPLAN_HF_QWEN3_MOE_TOP_K": "8",
        },
    ),
    "GPT-OSS-120B": ("hf_gpt_oss.py", {}),
    "Mixtral 8x7B": (
        "hf_mixtral.py",
        {  # Mixtral-8x7B's released config.json (huggingface.co/mistralai/Mixtral-8x7B-v0.1)
            "AUTOPLAN_HF_MIXTRAL_LAYERS": "32",
            "AUTOPLAN_HF_MIXTRAL_DIM": "4096",
            "AUTOPLAN_HF_MIXTRAL_HEADS": "32",
            "AUTOPLAN_HF_MIXTRAL_KV_HEADS": "8",
            "AUTOPLAN_HF_MIXTRAL_FFN": "14336",
            "AUTOPLAN_HF_MIXTRAL_EXPERTS": "8",
            "AUTOPLAN_HF_MIXTRAL_TOP_K": "2",
            "AUTOPLAN_HF_MIXTRAL_VOCAB": "32000",
            "AUTOPLAN_HF_MIXTRAL_SEQ": "4096",
        },
    ),
}


def model_key(model: str) -> str | None:
    return next((key for key in MODELS if model.startswith(key)), None)


def why_left_out(row: pd.Series) -> str:
    """'' for a row autoplan can express, else the reason."""
    if model_key(row["model"]) is None:
        return f"no example builds {row['model']}"
    if row["gpu"] != "H100":
        return f"{row['gpu']}: no shipped profile of that GPU"
    if "fine-grained blockwise" in str(row["precision"]).lower():
        return f"{row['precision']}: autoplan prices tensorwise FP8 scaling only"
    if pd.isna(row["ep"]):
        return "expert parallelism not published"
    if int(row["cp"]) > 1:
        return "context parallelism is not supported"
    return ""


def precision_of(row: pd.Series) -> str:
    """fp8 for an FP8 run (per-tensor current scaling: torchao's tensorwise recipe), else bf16."""
    return "fp8" if str(row["precision"]).upper().startswith("FP8") else "bf16"


def recompute_of(text) -> str:
    text = str(text).lower()
    if text.startswith("selective"):
        return "selective"
    if "checkpointing on" in text or text.startswith("full"):
        return "full"
    return "none"


def published_plan(row: pd.Series) -> Plan:
    gpus, tp, pp = int(row["gpus"]), int(row["tp"]), int(row["pp"])
    dp = gpus // (tp * pp)
    mbs = int(row["micro_batch"])
    v = 1 if pd.isna(row["vp"]) else int(row["vp"])
    fsdp = str(row["fsdp"]).lower().startswith("yes")
    runtime = runtime_fields(row, zero_stage=3 if fsdp else 1)
    return Plan(
        devices=gpus,
        dp=dp,
        tp=tp,
        pp=pp,
        ep=int(row["ep"]),
        expert_tp=1 if pd.isna(row["etp"]) else int(row["etp"]),  # blank: 1 (module docstring)
        sequence_parallel=tp > 1,
        micro_batch_size=mbs,
        num_microbatches=int(row["global_batch"]) // (dp * mbs),
        schedule_steps=schedule_steps_of(row, runtime=runtime.get("runtime", "autoplan")),
        schedule="interleaved_1f1b" if v > 1 else ("1f1b" if pp > 1 else "1f1b"),
        virtual_stages=v,
        zero_stage=3 if fsdp else 1,
        recompute=recompute_of(row["recompute"]),
        precision=precision_of(row),
        routing=RoutingModel(imbalance=1.0),  # the benchmarks forced balanced routing (module docstring)
        moe_a2a_overlap=overlaps_a2a(row),
        profile="dgx-h100",
        **runtime,
    )


def schedule_steps_of(row: pd.Series, *, runtime: str) -> int:
    """The published gradient accumulation (the CSV's ``ga``, as the notes print it) as schedule steps, where the
    run's software accumulates over several torch schedule steps (a pipeline under ``TORCH_PIPELINES``: NeMo
    AutoModel's GA); 1 elsewhere: Megatron runs all its micro-batches in one schedule, and without a pipeline the
    GA is the micro-batches (module docstring)."""
    if pd.isna(row["ga"]) or int(row["pp"]) == 1 or runtime not in TORCH_PIPELINES:
        return 1
    return int(row["ga"])


def overlaps_a2a(row: pd.Series) -> bool:
    """Whether the run overlapped the EP all-to-all with the other micro-batch's compute (Megatron-Core's
    --overlap-moe-expert-parallel-comm), as its notes say (module docstring)."""
    return "all-to-all overlap" in str(row["notes"]).lower()


def traced(model: str, batch: int):
    example, env = MODELS[model_key(model)]
    with environment(tuple(env.items())):
        return trace_model_file(EXAMPLES / example, batch, routing=RoutingModel(imbalance=1.0))


def predict(row: pd.Series, profile, graphs: dict) -> dict:
    plan = published_plan(row)
    key = (row["model"], plan.micro_batch_size)
    if key not in graphs:
        start = time.perf_counter()
        graphs[key] = traced(row["model"], plan.micro_batch_size)
        print(f"  traced {row['model']} in {time.perf_counter() - start:.1f} s")
    graph = graphs[key]
    cost = CostModel(graph, profile).estimate(plan)
    tokens = plan.global_batch_size * graph.seq_len
    tokens_per_gpu = tokens / (cost.step_time_s * plan.devices)
    tflops = cost.extra["model_flops"] / (cost.step_time_s * plan.devices) / 1e12
    published_tokens, published_tflops = row["tokens_per_s_per_gpu"], row["model_tflops_per_gpu"]
    metric = "tokens/s/GPU" if not pd.isna(published_tokens) else "model TFLOP/s/GPU"
    published = published_tokens if metric == "tokens/s/GPU" else published_tflops
    predicted = tokens_per_gpu if metric == "tokens/s/GPU" else tflops
    return {
        "name": row["name"],
        "plan": plan.describe(),
        "metric": metric,
        "published": float(published),
        "predicted": predicted,
        "error": predicted / float(published) - 1.0,
        "step_s": cost.step_time_s,
        "compute_s": cost.compute_s,
        "ep_comm_s": cost.ep_comm_s,
        "dp_s": cost.dp_comm_exposed_s,
        "zero_s": cost.zero_comm_s,
        "pp_s": cost.pp_comm_s,
        "bubble_s": cost.bubble_s,
        "peak_GiB": cost.peak_memory_bytes / 2**30,
        "fits": cost.feasible,
        "comparable": model_key(row["model"]) not in NOT_COMPARABLE,
        "predicted_tflops": tflops,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="run only rows whose name contains this")
    args = parser.parse_args()
    runs = pd.read_csv(HERE / "published_moe_runs.csv")
    profile = load_profile("dgx-h100")
    table = predict_published(runs, only=args.only, why_left_out=why_left_out, predict=predict, profile=profile)
    if table.empty:
        return
    errors = [abs(e) for e in table["error"]]
    same = [abs(e) for e, ok in zip(table["error"], table["comparable"]) if ok]
    print(f"median |error| {100 * statistics.median(errors):.1f}% over all {len(errors)} runs", end="")
    print(f"; {100 * statistics.median(same):.1f}% over the {len(same)} whose traced code is what ran" if same else "")
    write_results(table, "published_moe_runs")


if __name__ == "__main__":
    main()
