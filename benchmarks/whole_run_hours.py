"""Whole-run device-hours: autoplan's prediction against what Llama 3.1 405B and DeepSeek-V3 reported.

benchmarks/whole_run_hours.csv lists the published figures (each with its source, the exact
quote, the date and what the hours cover) and the published layout of each run. For every row
that autoplan can price, this script traces the model at its published size on the meta device
(examples/llama.py for Llama 3.1 405B, examples/hf_deepseek_v3.py for DeepSeek-V3), pins the
published layout with ``Plan(...)``, prices one step with the cost model and scales it to the run:

    steps       = tokens / (global batch x sequence length)
    GPU-hours   = devices x steps x step time / 3600
    with goodput: GPU-hours / expected goodput   (autoplan/cost/run/reliability.py: Daly's interval
                  and Poisson failures at the profile's failure rate, synchronous checkpoints)

and compares with the published GPU-hours (ratio = predicted / published). Nothing here is fitted
or tuned on these figures: the profiles, the cost model and the reliability model are the shipped
ones. (The dgx-h100 failure rate itself comes from the Llama 3 405B run's interruption count, so
its goodput is not independent of that run; docs/whole-run-checks.md says so.)

Profiles: Llama ran on H100s, priced on profiles/dgx-h100.yaml. DeepSeek-V3 ran on H800s, for
which no profile ships: the H800 is an H100 whose NVLink is cut from 900 to 400 GB/s, so the
script builds one from dgx-h100 with every intra-node busbw scaled by 400/900 and everything else
(compute, HBM, 400 Gb/s InfiniBand per GPU, storage, failure rate) unchanged.

What is pinned beyond the CSV's columns, and why (docs/whole-run-checks.md has the sources):

- Llama 3.1 405B: explicit pipeline stages that follow the paper's balancing (the embedding and the
  head each take one layer's slot: 128 slots over pp x v chunks). V is not published; with V = 8 a
  chunk would hold no layer, which the cost model rejects, so V = 4 (the CSV's ``assumed`` column).
- DeepSeek-V3 ran DualPipe (report section 3.2.1), priced as its V form, ``dualpipev``
  (:data:`PUBLISHED_SCHEDULE`: p ranks of two chunks, one copy of the parameters instead of DualPipe's two,
  the same bubble per deepseek-ai/DualPipe's README), with the EP all-to-all hidden under each F&B pair's
  compute (``moe_a2a_overlap``, :data:`A2A_OVERLAP`; cost/moe/a2a_overlap.py counts the pairs from the V
  order). autoplan's executor runs that layout overlapped (types/moe_overlap.py: selective recomputation
  too), but autoplan's memory model says it does not fit in 80 GB (``fits``), so the planner does not return it
  and the plan is priced through the cost model API as a check of the model. It trained its GEMMs in FP8 with
  1x128 / 128x128 block scaling (report section 3.3): priced with fp8 and :data:`FP8_RECIPE` (rowwise, the
  nearest recipe autoplan prices) at the profile's FP8 peak, with balanced routing; its experts stay 16-bit,
  as autoplan's executor runs them (cost/compute/fp8.py ``FP8_EXPERT_RUNTIMES``). The sensitivity row
  ``deepseek-v3-pretrain-megatron`` prices the same layout for Megatron-Core's runtime (:data:`RUNTIME`: fused
  kernels, Transformer Engine's FP8 over the experts too, te_current). ``--schedule`` sets another schedule
  (1f1b: Megatron-Core's combined 1F1B pairing), ``--bf16`` prices it in bf16, ``--a2a-exposed`` prices the
  all-to-all exposed. ``recompute_a2a_s`` is the all-to-all the plan's recomputation re-runs (0 under
  selective since it keeps the all-to-alls' outputs, as DeepSeek's recomputation re-runs no communication).

For each run the published layout is priced as published (``fits`` says whether autoplan's memory
model agrees that it fits in 80 GB); ``step_s_if_fits`` is the fastest recomputation setting that
autoplan says fits, the rest of the layout unchanged.

    python benchmarks/whole_run_hours.py [--only NAME_SUBSTRING] [--schedule NAME] [--bf16] [--a2a-exposed]
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import time
from pathlib import Path

import pandas as pd
from _results import write_results

from autoplan.calibrate.runs import environment
from autoplan.cost import CostModel
from autoplan.cost.run.reliability import expected_goodput
from autoplan.profile import load_profile
from autoplan.trace import trace_model_file
from autoplan.types import Plan
from autoplan.types.moe import RoutingModel
from autoplan.types.profile import Profile
from autoplan.types.schedules import V_SCHEDULES

HERE = Path(__file__).parent
EXAMPLES = HERE.parent / "examples"
H800_NVLINK_FRACTION = 400.0 / 900.0  # H800 NVLink 400 GB/s vs H100 SXM 900 GB/s (NVIDIA datasheets)
RECOMPUTE_ORDER = ("none", "selective", "full")

#: model column -> (example file, environment setting its published size, routing model or None)
MODELS = {
    "Llama 3.1 405B": (
        "llama.py",
        {  # Llama 3 report Table 3 and the released config.json (meta-llama/Llama-3.1-405B)
            "AUTOPLAN_LLAMA_N_LAYERS": "126",
            "AUTOPLAN_LLAMA_DIM": "16384",
            "AUTOPLAN_LLAMA_N_HEADS": "128",
            "AUTOPLAN_LLAMA_N_KV_HEADS": "8",
            "AUTOPLAN_LLAMA_FFN_DIM": "53248",
            "AUTOPLAN_LLAMA_VOCAB_SIZE": "128256",
            "AUTOPLAN_LLAMA_SEQ_LEN": "8192",
            "AUTOPLAN_LLAMA_ROPE_THETA": "500000",
        },
        None,
    ),
    # examples/hf_deepseek_v3.py builds the published size by default (report section 4.2)
    "DeepSeek-V3 671B": ("hf_deepseek_v3.py", {}, RoutingModel(imbalance=1.0)),
}
#: hardware column -> how its profile is made
PROFILES = {"H100-80GB": "dgx-h100", "H800": "h800 (dgx-h100, NVLink x 400/900)"}
#: runs priced in a precision other than the one they ran in: the label the table carries
LABELS = {
    "deepseek-v3-pretrain": "FP8 with torchao's rowwise scaling, the nearest autoplan prices to the run's 1x128 / "
    "128x128 block scaling; experts 16-bit, as autoplan's executor runs them",
    "deepseek-v3-pretrain-megatron": "FP8 with Transformer Engine's current scaling over every linear and the routed "
    "experts (Megatron-Core's runtime)",
}
#: runs whose published schedule is not the CSV's 1F1B, and the source: DualPipe priced as its V form (module
#: docstring)
PUBLISHED_SCHEDULE = {  # arXiv 2412.19437 section 3.2.1; deepseek-ai/DualPipe
    "deepseek-v3-pretrain": "dualpipev",
    "deepseek-v3-pretrain-megatron": "dualpipev",
}
#: FP8 runs' recipe: DeepSeek-V3 scales activations per 1x128 tile and weights per 128x128 block (arXiv 2412.19437
#: section 3.3.2); rowwise (one scale per row of each operand) is the finest recipe autoplan prices
FP8_RECIPE = {"deepseek-v3-pretrain": "rowwise", "deepseek-v3-pretrain-megatron": "te_current"}
#: runs priced for a runtime other than autoplan's executor, and why: Megatron-Core with Transformer Engine fuses
#: norms, activations and casts and runs every linear and routed expert in FP8 (cost/compute/fp8.py), as DeepSeek's
#: own framework ran its GEMMs, experts included, in FP8 with fused kernels (arXiv 2412.19437 sections 3.3, 3.2.2)
RUNTIME = {"deepseek-v3-pretrain-megatron": "megatron"}
#: runs that overlapped the EP all-to-all with the other micro-batch's compute, and the source that says so
A2A_OVERLAP = {
    run: "DualPipe overlaps each F&B chunk pair's all-to-all with computation (arXiv 2412.19437, section 3.2.1, "
    "Figure 4)"
    for run in ("deepseek-v3-pretrain", "deepseek-v3-pretrain-megatron")
}


def h800_profile() -> Profile:
    """dgx-h100 with every intra-node collective's busbw scaled by 400/900 (module docstring)."""
    profile = copy.deepcopy(load_profile("dgx-h100"))
    profile.name = "h800-from-dgx-h100"
    profile.description = "dgx-h100 with NVLink busbw x 400/900: an H800 (benchmarks/whole_run_hours.py)"
    for kind, fit in profile.intra_node.collectives.items():
        profile.intra_node.collectives[kind] = dataclasses.replace(
            fit,
            busbw_bytes_per_s=fit.busbw_bytes_per_s * H800_NVLINK_FRACTION,
            source=f"{fit.source}; x 400/900 for the H800's NVLink",
            points=[],
        )
    return profile


def profile_for(hardware: str) -> Profile:
    return h800_profile() if hardware == "H800" else load_profile(PROFILES[hardware])


def traced(model: str):
    example, env, routing = MODELS[model]
    with environment(tuple(env.items())):
        return trace_model_file(EXAMPLES / example, 1, routing=routing)


def balanced_slots(layers: list[str], chunks: int) -> list[list[str]]:
    """Llama 3's pipeline balancing: the embedding and the head each take one layer's slot, so
    (layers + 2) slots split evenly over ``chunks``; the first and last chunk hold one layer fewer."""
    slots = [None, *layers, None]
    per_chunk, extra = divmod(len(slots), chunks)
    if extra or per_chunk < 2:
        raise ValueError(f"{len(layers)} layers + embedding + head do not split into {chunks} chunks of >= 2 slots")
    return [[s for s in slots[i * per_chunk : (i + 1) * per_chunk] if s] for i in range(chunks)]


@dataclasses.dataclass(frozen=True)
class Pricing:
    """How a run's pipeline is priced beyond the CSV: the schedule ('' = the published pp's 1F1B, interleaved
    at v > 1) and whether the runs of :data:`A2A_OVERLAP` overlap their all-to-all (module docstring)."""

    schedule: str = ""
    a2a_overlap: bool = True
    bf16: bool = False  # price FP8 runs in bf16 (module docstring)


def published_plan(row: pd.Series, graph, *, recompute: str | None = None, pricing: Pricing = Pricing()) -> Plan:
    pp, v, dp, mbs = int(row.pp), int(row.virtual_stages), int(row.dp), int(row.micro_batch)
    routing = MODELS[row.model][2]
    schedule = pricing.schedule or PUBLISHED_SCHEDULE.get(row.run, "")
    v = 2 if schedule in V_SCHEDULES else v  # two chunks per rank in the V placement
    precision = "bf16" if pricing.bf16 and row.precision == "fp8" else str(row.precision)
    stages = balanced_slots(list(graph.layers), pp * v) if row.model.startswith("Llama") else []
    return Plan(
        devices=int(row.devices),
        dp=dp,
        tp=int(row.tp),
        pp=pp,
        ep=int(row.ep),
        micro_batch_size=mbs,
        num_microbatches=int(row.global_batch) // (dp * mbs),
        schedule=schedule or ("interleaved_1f1b" if v > 1 else "1f1b"),
        virtual_stages=v,
        zero_stage=int(row.zero_stage),
        recompute=recompute or str(row.recompute),
        sequence_parallel=str(row.sequence_parallel).lower() == "true",
        precision=precision,
        fp8_recipe=FP8_RECIPE.get(row.run, "") if precision == "fp8" else "",
        grad_reduce_dtype=str(row.grad_reduce_dtype),
        routing=routing,
        stages=stages,
        moe_a2a_overlap=pricing.a2a_overlap and row.run in A2A_OVERLAP,
        runtime=RUNTIME.get(row.run, "autoplan"),
    )


def step_if_fits(row: pd.Series, graph, model: CostModel, pricing: Pricing) -> tuple[float | None, str]:
    """The fastest recomputation setting autoplan says fits, the rest of the layout as published (full
    recomputation re-runs the forward inside the backward, so no all-to-all overlap beside it)."""
    for recompute in RECOMPUTE_ORDER[RECOMPUTE_ORDER.index(str(row.recompute)) :]:
        priced = dataclasses.replace(pricing, a2a_overlap=pricing.a2a_overlap and recompute != "full")
        cost = model.estimate(published_plan(row, graph, recompute=recompute, pricing=priced))
        if cost.feasible:
            return cost.step_time_s, recompute
    return None, "none fits"


def throughput_step_s(row: pd.Series, model_flops: float) -> float | None:
    """The step time the run's published TFLOP/s per GPU implies for autoplan's FLOP count of the
    step (None where none is published); the FLOP conventions may differ (docs/whole-run-checks.md)."""
    if pd.isna(row.published_tflops_per_gpu):
        return None
    return model_flops / (float(row.published_tflops_per_gpu) * 1e12 * int(row.devices))


def recompute_a2a_s(model: CostModel, plan: Plan, ep_comm_s: float) -> float:
    """The step's all-to-all seconds that ``plan``'s recomputation re-runs (cost/stages.py re-adds the forward
    all-to-all of a block recomputed in full): its EP seconds less the same plan's without recomputation."""
    if plan.ep <= 1 or plan.recompute == "none":
        return 0.0
    return ep_comm_s - model.estimate(dataclasses.replace(plan, recompute="none")).ep_comm_s


def whole_run(row: pd.Series, graph, profile: Profile, pricing: Pricing = Pricing()) -> dict:
    """Price one step of the published layout and scale it to the run (module docstring)."""
    model = CostModel(graph, profile)
    plan = published_plan(row, graph, pricing=pricing)
    cost = model.estimate(plan)
    tokens_per_step = int(row.global_batch) * graph.seq_len
    steps = float(row.tokens) / tokens_per_step
    gpu_hours = int(row.devices) * steps * cost.step_time_s / 3600
    goodput = expected_goodput(
        params=graph.param_count, devices=int(row.devices), profile=profile, step_time_s=cost.step_time_s
    )
    published = float(row.published_gpu_hours)
    fits_step_s, fits_recompute = step_if_fits(row, graph, model, pricing)
    return {
        "run": row.run,
        "hardware": row.hardware,
        "profile": profile.name,
        "label": LABELS.get(row.run, "") if plan.precision == "fp8" else "",
        "a2a_overlap": A2A_OVERLAP.get(row.run, "") if plan.moe_a2a_overlap else "",
        "plan": plan.describe(),
        "tokens": float(row.tokens),
        "steps": steps,
        "step_s": cost.step_time_s,
        "published_implied_step_s": published * 3600 / (int(row.devices) * steps),
        "throughput_implied_step_s": throughput_step_s(row, cost.extra["model_flops"]),
        "compute_s": cost.compute_s + cost.recompute_s,
        "recompute_s": cost.recompute_s,
        "bubble_s": cost.bubble_s,
        "tp_s": cost.tp_comm_s,
        "ep_s": cost.ep_comm_s,
        "recompute_a2a_s": recompute_a2a_s(model, plan, cost.ep_comm_s),
        "grad_accum_s": cost.grad_accum_s,
        "pp_s": cost.pp_comm_s,
        "dp_exposed_s": cost.dp_comm_exposed_s,
        "model_tflops_per_gpu": cost.extra["model_flops"] / (cost.step_time_s * int(row.devices)) / 1e12,
        "mfu": cost.mfu,
        "peak_GiB": cost.peak_memory_bytes / 2**30,
        "fits": cost.feasible,
        "step_s_if_fits": fits_step_s,
        "recompute_if_fits": fits_recompute,
        "goodput": goodput.expected_goodput,
        "checkpoint_every_steps": goodput.checkpoint_every_steps,
        "predicted_gpu_hours": gpu_hours,
        "predicted_gpu_hours_with_goodput": gpu_hours / goodput.expected_goodput,
        "published_gpu_hours": published,
        "ratio": gpu_hours / published,
        "ratio_with_goodput": gpu_hours / goodput.expected_goodput / published,
    }


def print_table(table: pd.DataFrame) -> None:
    shown = table.assign(
        predicted_M=table.predicted_gpu_hours / 1e6,
        with_goodput_M=table.predicted_gpu_hours_with_goodput / 1e6,
        published_M=table.published_gpu_hours / 1e6,
    )[
        [
            "run",
            "step_s",
            "published_implied_step_s",
            "throughput_implied_step_s",
            "model_tflops_per_gpu",
            "peak_GiB",
            "fits",
            "goodput",
            "predicted_M",
            "with_goodput_M",
            "published_M",
            "ratio",
            "ratio_with_goodput",
        ]
    ]
    with pd.option_context("display.width", 250, "display.max_columns", 30):
        print(shown.round(3).to_string(index=False))
    for _, row in table[table.label != ""].iterrows():
        print(f"  {row.run}: {row.label}")
    for _, row in table[table.a2a_overlap != ""].iterrows():
        print(f"  {row.run}: EP all-to-all overlapped: {row.a2a_overlap}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="run only rows whose name contains this")
    parser.add_argument("--schedule", default="", help="the pipeline schedule (default: the published one)")
    parser.add_argument("--bf16", action="store_true", help="price the FP8 runs in bf16")
    parser.add_argument("--a2a-exposed", action="store_true", help="price every EP all-to-all exposed")
    args = parser.parse_args()
    pricing = Pricing(schedule=args.schedule, a2a_overlap=not args.a2a_exposed, bf16=args.bf16)
    runs = pd.read_csv(HERE / "whole_run_hours.csv")
    runs = runs[runs.run.str.contains(args.only, regex=False)]
    rows, graphs = [], {}
    for _, row in runs.iterrows():
        if not pd.isna(row.not_priced):
            print(f"not priced {row.run}: {row.not_priced}")
            continue
        if row.model not in graphs:
            start = time.perf_counter()
            graphs[row.model] = traced(row.model)
            print(f"traced {row.model} in {time.perf_counter() - start:.1f} s")
        rows.append(whole_run(row, graphs[row.model], profile_for(row.hardware), pricing))
    if not rows:
        return
    table = pd.DataFrame(rows)
    print_table(table)
    write_results(table, "whole_run_hours")


if __name__ == "__main__":
    main()
