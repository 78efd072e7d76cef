"""A 70B-class Llama fine-tuned on one 8xH100 node (issue 34's check): LoRA without offload, full
fine-tuning with and without CPU offload, each searched by the planner on the dgx-h100 profile.

The model is examples/lora_llama.py at Llama 3 70B's shape (AUTOPLAN_LORA_SHAPE=70b: 80 layers, dim
8192, 64 heads, 8 KV heads, FFN 28672, vocab 128256), sequence 4096, 8 sequences a step. LoRA rank 16
on every attention and MLP linear (peft); AUTOPLAN_LORA_RANK=0 trains the same model whole. For each
case the row says whether a plan fits, its layout, predicted step time, peak memory per device, and
the planner's one sentence when nothing fits. Nothing is fitted: the figures are the shipped
profile's (datasheets; its host section for offload). Writes benchmarks/results/fine_tune_70b.csv.

    python benchmarks/fine_tune_70b.py      # about 2 minutes per trace on 2 CPU cores
"""

from __future__ import annotations

import os
from pathlib import Path

from _results import write_results

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "lora_llama.py"
SHAPE = dict(AUTOPLAN_LORA_SHAPE="70b", AUTOPLAN_LLAMA_SEQ_LEN="4096")
CASES = (  # (case, LoRA rank, --fix)
    ("lora-r16", "16", "offload=none"),
    ("full-offload-searched", "0", ""),
    ("full-no-offload", "0", "offload=none"),
)
DEVICES, BATCH = 8, 8


def _trace(rank: str):
    from autoplan.trace import trace_model_file

    os.environ.update(SHAPE, AUTOPLAN_LORA_RANK=rank)
    return trace_model_file(EXAMPLE, BATCH // DEVICES)


def row(case: str, graph, fix: str) -> dict:
    from autoplan.errors import AutoplanError
    from autoplan.solve.api import plan_graph

    trained = graph.trainable_param_count
    out = dict(case=case, params_b=graph.param_count / 1e9, trainable_b=trained / 1e9, fix=fix)
    try:
        result = plan_graph(graph, devices=DEVICES, profile="dgx-h100", batch_size=BATCH, fix=fix or None)
    except AutoplanError as exc:
        return out | dict(fits=False, plan="", step_s=None, peak_gib=None, why=str(exc))
    cost = result.best_cost
    return out | dict(
        fits=True,
        plan=result.best.describe(),
        step_s=cost.step_time_s,
        peak_gib=cost.peak_memory_bytes / 2**30,
        optimizer_s=cost.optimizer_s,
        why="",
    )


def main() -> None:
    graphs, table = {}, []
    for case, rank, fix in CASES:
        graph = graphs.get(rank) or graphs.setdefault(rank, _trace(rank))
        table.append(row(case, graph, fix))
        r = table[-1]
        shown = f"{r['step_s']:.2f} s/step, {r['peak_gib']:.1f} GiB  {r['plan']}" if r["fits"] else r["why"]
        print(f"{case:24s} trainable {r['trainable_b']:.2f}B of {r['params_b']:.1f}B  {shown}")
    write_results(table, "fine_tune_70b")


if __name__ == "__main__":
    main()
