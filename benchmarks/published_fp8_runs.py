"""Predict published FP8 training runs on H100s with the shipped dgx-h100 profile (issue 17 (d)).

benchmarks/published_fp8_runs.csv lists the runs (each with its source, date and notes):
NVIDIA's Megatron-Bridge and NeMo performance summaries (Transformer Engine FP8 on DGX H100)
and torchtitan's docs/performance.md (torchao float8 on Meta's Grand Teton H100s). For each run
autoplan can express, this script traces the model at its published size on the meta device
(examples/llama.py, examples/gpt.py), pins the published layout with ``Plan(...)`` at
precision "fp8" and predicts tokens/s per GPU. Nothing is fitted on these runs: the same profile
and cost model price every row (docs/cost-model.md, "FP8"). The bf16 prediction of the same
plan is printed beside it, so the predicted FP8 speed-up can be read too.

How each layout is pinned, as its software ran it:

- dp = GPUs / (tp pp); mbs, the global batch, tp, pp and virtual stages (interleaved 1F1B) as
  published; "FSDP" (Megatron FSDP, torchtitan's FSDP2) as ZeRO-3, Megatron without FSDP as
  ZeRO-1 (the distributed optimizer); sequence parallelism and TP comm overlap as the CSV says
  (Megatron's H100 performance recipes and torchtitan's async TP);
- recompute as published (none where a summary does not print it: an assumption, in the notes);
- the runtime that ran it (the CSV's ``runtime`` and ``compile`` columns, _results.runtime_fields):
  NeMo and Megatron-Bridge rows as ``megatron`` (Megatron-Core with Transformer Engine, the FP8
  recipe their precision names, the distributed optimizer's parameter all-gather overlapped),
  torchtitan rows as ``torchtitan`` with torch.compile (every table of torchtitan's
  benchmarks/llama3_h100_202412_torchtitan.md names it);
- context parallelism (CP > 1) as Megatron-Core runs it: Transformer Engine's ``cp_comm_type``
  default "p2p", a ring of K,V sends overlapped with each step's attention (Plan.cp_variant
  "ring"); dp = GPUs / (tp pp cp), the cp ranks of a replica sharing its micro-batches.

Each row is priced for the runtime and FP8 recipe that ran it (``runtime_fields``): NeMo and
Megatron-Bridge rows as Megatron-Core with Transformer Engine's delayed or current scaling, whose
casts are fused into the norms and activations and whose weights are cast once per step
(autoplan/cost/compute/fp8.py), torchtitan rows with torchao's tensorwise recipe, compiled.
What still differs between the runs and what autoplan prices: torchtitan
ran H100s with HBM2e (2.4 TB/s, 96 GB) at a 500 W limit, slower than the SXM5 part the dgx-h100
profile describes, and keeps its output head in bf16. The summary gives the median |error| over
all priced runs and over the DGX H100 runs alone.

Rows left out, with the reason printed: models no example builds (Nemotron's squared-ReLU MLP).

    python benchmarks/published_fp8_runs.py [--only NAME_SUBSTRING]
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

HERE = Path(__file__).parent
EXAMPLES = HERE.parent / "examples"
LLAMA3_VOCAB = 128256
#: model -> (example file, its size as released: config.json / the paper; seq set per row)
MODELS = {
    "Llama 3 8B": ("llama.py", dict(N_LAYERS=32, DIM=4096, N_HEADS=32, N_KV_HEADS=8, FFN_DIM=14336)),
    "Llama 3 70B": ("llama.py", dict(N_LAYERS=80, DIM=8192, N_HEADS=64, N_KV_HEADS=8, FFN_DIM=28672)),
    "Llama 3.1 405B": ("llama.py", dict(N_LAYERS=126, DIM=16384, N_HEADS=128, N_KV_HEADS=8, FFN_DIM=53248)),
    "Llama 2 7B": ("llama.py", dict(N_LAYERS=32, DIM=4096, N_HEADS=32, N_KV_HEADS=32, FFN_DIM=11008, VOCAB_SIZE=32000)),
    "Llama 2 13B": (
        "llama.py",
        dict(N_LAYERS=40, DIM=5120, N_HEADS=40, N_KV_HEADS=40, FFN_DIM=13824, VOCAB_SIZE=32000),
    ),
    "Llama 2 70B": ("llama.py", dict(N_LAYERS=80, DIM=8192, N_HEADS=64, N_KV_HEADS=8, FFN_DIM=28672, VOCAB_SIZE=32000)),
    "GPT3 5B": ("gpt.py", dict(N_LAYER=24, N_EMBD=4096, N_HEAD=32)),
    "GPT3 20B": ("gpt.py", dict(N_LAYER=44, N_EMBD=6144, N_HEAD=48)),
    "GPT3 175B": ("gpt.py", dict(N_LAYER=96, N_EMBD=12288, N_HEAD=96)),
}
GPT3_VOCAB = 50304  # GPT-2 BPE's 50257 padded to a multiple of 128 (Megatron's make-vocab-size-divisible-by)


def model_key(model: str) -> str | None:
    """The MODELS entry of a CSV model name (Llama 3.1 8B/70B have Llama 3's shapes)."""
    name = model.replace("Llama 3.1 8B", "Llama 3 8B").replace("Llama 3.1 70B", "Llama 3 70B")
    return name if name in MODELS else None


def why_left_out(row: pd.Series) -> str:
    """'' for a row autoplan can express, else the reason."""
    if model_key(row["model"]) is None:
        return f"no example builds {row['model']}"
    return ""


def environment_of(row: pd.Series) -> tuple[tuple[str, str], ...]:
    """AUTOPLAN_* variables that build the row's model at its published size and sequence."""
    example, sizes = MODELS[model_key(row["model"])]
    if example == "gpt.py":
        sizes = {**sizes, "VOCAB_SIZE": GPT3_VOCAB, "BLOCK_SIZE": int(row["seq_len"])}
        return tuple((f"AUTOPLAN_GPT_{k}", str(v)) for k, v in sizes.items())
    sizes = {"VOCAB_SIZE": LLAMA3_VOCAB, **sizes, "SEQ_LEN": int(row["seq_len"])}
    return tuple((f"AUTOPLAN_LLAMA_{k}", str(v)) for k, v in sizes.items())


def recompute_of(text) -> str:
    text = str(text).lower()
    return "selective" if text.startswith("selective") else "full" if text.startswith("full") else "none"


def published_plan(row: pd.Series, *, precision: str) -> Plan:
    gpus, tp, pp, mbs = int(row["gpus"]), int(row["tp"]), int(row["pp"]), int(row["micro_batch"])
    cp = int(row["cp"])
    dp = gpus // (tp * pp * cp)
    v = 1 if pd.isna(row["vp"]) else int(row["vp"])
    sp = tp > 1 and str(row["sequence_parallel"]).lower() == "yes"
    zero = 3 if str(row["fsdp"]).lower().startswith("yes") else 1
    runtime = runtime_fields(row, zero_stage=zero)
    if precision != "fp8":
        runtime.pop("fp8_recipe", None)  # the bf16 comparison of the same layout
    return Plan(
        devices=gpus,
        dp=dp,
        tp=tp,
        pp=pp,
        cp=cp,
        cp_variant="ring",  # Megatron-Core's CP: TE's p2p ring (docstring)
        micro_batch_size=mbs,
        num_microbatches=int(row["global_batch"]) // (dp * mbs),
        schedule="interleaved_1f1b" if v > 1 else "1f1b",
        virtual_stages=v,
        zero_stage=zero,
        recompute=recompute_of(row["recompute"]),
        sequence_parallel=sp,
        tp_comm_overlap=sp and str(row["tp_comm_overlap"]).lower() == "yes",
        precision=precision,
        profile="dgx-h100",
        **runtime,
    )


def traced(row: pd.Series, graphs: dict):
    key = (row["model"], int(row["seq_len"]), int(row["micro_batch"]))
    if key not in graphs:
        start = time.perf_counter()
        example = MODELS[model_key(row["model"])][0]
        with environment(environment_of(row)):
            graphs[key] = trace_model_file(EXAMPLES / example, int(row["micro_batch"]))
        print(f"  traced {row['model']} (seq {key[1]}, batch {key[2]}) in {time.perf_counter() - start:.1f} s")
    return graphs[key]


def predict(row: pd.Series, profile, graphs: dict) -> dict:
    graph = traced(row, graphs)
    plan = published_plan(row, precision="fp8")
    cost = CostModel(graph, profile).estimate(plan)
    bf16 = CostModel(graph, profile).estimate(published_plan(row, precision="bf16"))
    tokens = plan.global_batch_size * graph.seq_len
    predicted = tokens / (cost.step_time_s * plan.devices)
    published = float(row["tokens_per_s_per_gpu"])
    return {
        "name": row["name"],
        "plan": plan.describe(),
        "runtime": plan.runtime,
        "recipe": plan.fp8_recipe_used,
        "hardware": row["hardware"],
        "published": published,
        "predicted": predicted,
        "error": predicted / published - 1.0,
        "fp8_speedup": bf16.step_time_s / cost.step_time_s,
        "step_s": cost.step_time_s,
        "compute_s": cost.compute_s,
        "tp_s": cost.tp_comm_s,
        "dp_s": cost.dp_comm_exposed_s,
        "zero_s": cost.zero_comm_s,
        "pp_s": cost.pp_comm_s,
        "bubble_s": cost.bubble_s,
        "peak_GiB": cost.peak_memory_bytes / 2**30,
        "fits": cost.feasible,
    }


def summary(table: pd.DataFrame) -> str:
    errors = [abs(e) for e in table["error"]]
    dgx = [abs(e) for e, hw in zip(table["error"], table["hardware"]) if hw == "DGX-H100"]
    text = f"median |error| {100 * statistics.median(errors):.1f}% over all {len(errors)} runs"
    return text + (f"; {100 * statistics.median(dgx):.1f}% over the {len(dgx)} DGX H100 runs" if dgx else "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="run only rows whose name contains this")
    args = parser.parse_args()
    runs = pd.read_csv(HERE / "published_fp8_runs.csv")
    profile = load_profile("dgx-h100")
    table = predict_published(runs, only=args.only, why_left_out=why_left_out, predict=predict, profile=profile)
    if table.empty:
        return
    print(summary(table))
    write_results(table, "published_fp8_runs")


if __name__ == "__main__":
    main()
