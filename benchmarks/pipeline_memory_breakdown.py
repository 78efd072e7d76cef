"""The priced peak of a published pipelined run, term by term (an investigation aid, no pricing of its own).

For each row of benchmarks/published_moe_runs.csv whose name contains ``--only``, the plan is pinned as
published_moe_runs.py pins it and priced with the cost API (``CostModel.priced_stages``, ``stage_memory``); the
worst stage's peak is split into the terms cost/memory/per_device.py ``stage_memory`` sums:

    peak = W + O + max(M1, M2, M3),  M2 = n' S + G + max(T, scatter - S_block) + buffers (the pipeline's usual peak)

with the transient T split into its parts (cost/memory/plan.py ``_stage_memory``): the kept output gradients
(pending K), the boundary tensors and gradients the replay counts (``sent`` D + ``grads`` D_g: torch's receive
slots, m per chunk input and output gradient, plus the sends held to the step's end: cost/pp/receive_slots.py,
rank_memory.py) and the recomputed block's re-made activations, of one schedule step (the row's GA as
``schedule_steps``: NeMo AutoModel runs its local batch, the notes' "LBS n", as one ``schedule.step`` and
accumulates over several). Beside it: the plan with all its micro-batches in one schedule step (as it was priced
before 2026-12), that plan under ``runtime=megatron`` (Megatron-Core's own schedule, one send and one receive
buffer), and ``peak_if_grads_at_D``: the peak with every gradient weighed as the whole boundary (D_g = D, as
autoplan priced it before gradients had their own size: the forward boundary also carries the traced causal mask
and rotary tables, which send no gradient back). ``--whole-run`` adds
benchmarks/whole_run_hours.csv's rows (Llama 3.1 405B).

    python benchmarks/pipeline_memory_breakdown.py [--only automodel_dsv3]
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

import pandas as pd
from published_moe_runs import published_plan, traced, why_left_out

from autoplan.cost import CostModel
from autoplan.cost.memory.shared import UnsharedStages
from autoplan.cost.pp.receive_slots import slot_changes
from autoplan.profile import load_profile
from autoplan.types.schedule_steps import schedule_step_plan

HERE = Path(__file__).parent
GIB = 2**30


def breakdown(model: CostModel, plan) -> dict:
    """The worst stage's terms in GiB (module docstring)."""
    stages, _, _ = model.priced_stages(plan)
    memories = model.stage_memory(plan, stages)
    index = max(range(len(memories)), key=lambda i: memories[i].peak_bytes)
    stage, memory = stages[index], memories[index]
    step = schedule_step_plan(plan)  # the memory is one schedule step's (types/schedule_steps.py)
    in_flight, after, pending, sent, transient = UnsharedStages().held(step, index, stage)
    where = dict(schedule=plan.schedule, pp=plan.pp, virtual_stages=plan.virtual_stages, m=step.num_microbatches)
    forward, back = slot_changes(rank=index, **where)[0]  # inputs at D_in, output gradients at D_g,out
    slots = forward * stage.boundary_bytes + back * stage.output_grad_bytes if sent else 0.0
    weights, grads, optimizer, activations, buffers = memory.at_peak_bytes
    whole = [replace(s, boundary_grad_bytes=s.boundary_bytes, output_grad_bytes=s.output_bytes) for s in stages]
    before = max(m.peak_bytes for m in model.stage_memory(plan, whole))
    return {
        "runtime": plan.runtime,
        "stage": index,
        "m": plan.num_microbatches,
        "steps": plan.schedule_steps,
        "v": plan.virtual_stages,
        "weights": weights / GIB,
        "grads": grads / GIB,
        "optimizer": optimizer / GIB,
        "acts_in_flight": after * stage.saved_bytes / GIB,
        "held_mb": after,
        "kept_grads": pending * stage.wgrad_held_bytes / GIB,
        "recv_slots_at_start": slots / GIB,
        "sent_and_slots_at_peak": sent / GIB,
        "boundary_MiB": stage.boundary_bytes / 2**20,
        "grad_boundary_MiB": stage.boundary_grad_bytes / 2**20,
        "peak_if_grads_at_D": before / GIB,
        "recompute_transient": transient / GIB,
        "activations_term": activations / GIB,
        "buffers_term": buffers / GIB,
        "peak": memory.peak_bytes / GIB,
    }


def whole_run_rows(only: str) -> list[dict]:
    """The breakdown of benchmarks/whole_run_hours.csv's rows whose run contains ``only``, pinned as that script
    pins them (its own runtime: autoplan's executor for Llama 3.1 405B), and under Megatron-Core's runtime."""
    import whole_run_hours as whole

    rows = []
    for _, row in pd.read_csv(HERE / "whole_run_hours.csv").iterrows():
        if only not in row["run"] or pd.isna(row["pp"]):
            continue
        graph = whole.traced(row["model"])
        plan = whole.published_plan(row, graph)
        model = CostModel(graph, whole.profile_for(row["hardware"]))
        for label, variant in {"as pinned": plan, "megatron": replace(plan, runtime="megatron")}.items():
            rows.append({"name": row["run"], "variant": label, **breakdown(model, variant)})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="automodel_dsv3")
    parser.add_argument("--whole-run", default="", help="also break down whole_run_hours.csv rows whose run has this")
    args = parser.parse_args()
    runs = pd.read_csv(HERE / "published_moe_runs.csv")
    profile, rows = load_profile("dgx-h100"), []
    for _, row in runs.iterrows():
        if args.only not in row["name"] or why_left_out(row):
            continue
        plan = published_plan(row)
        model = CostModel(traced(row["model"], plan.micro_batch_size), profile)
        one = replace(plan, schedule_steps=1)  # all m micro-batches in one schedule step (as priced before 2026-12)
        variants = {"as pinned": plan, f"m={plan.num_microbatches} in one schedule step": one}
        variants["megatron"] = replace(one, runtime="megatron")
        for label, variant in variants.items():
            rows.append({"name": row["name"], "variant": label, **breakdown(model, variant)})
    rows += whole_run_rows(args.whole_run) if args.whole_run else []
    table = pd.DataFrame(rows).round(2).set_index(["name", "variant"]).T
    with pd.option_context("display.width", 250, "display.max_columns", 30):
        print(table.round(2).to_string())


if __name__ == "__main__":
    main()
