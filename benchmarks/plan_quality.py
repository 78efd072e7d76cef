"""Plan quality: the planner's predicted throughput beside rule-of-thumb plans.

For several GPT sizes (examples/gpt.py resized through AUTOPLAN_GPT_*, and
examples/gpt3_175b.py) and cluster sizes on the dgx-a100 profile, it prices:

- autoplan: the full search;
- Megatron rule of thumb: tp = devices per node (8), pp = the fewest stages that fit, dp the
  rest, sequence parallelism, 1F1B, distributed optimizer (ZeRO-1) (Narayanan et al. SC'21
  section 3.3 takeaways); micro-batch size and recomputation left to the search;
- pure FSDP: dp = devices, ZeRO-3, tp = pp = 1 (micro-batch and recomputation searched);
- pure DP: dp = devices, ZeRO-0, tp = pp = 1, where it fits.

Every number is the same cost model's prediction (so this compares plans, not models).
Prints a table; writes benchmarks/results/plan_quality.csv.

    python benchmarks/plan_quality.py [--quick]
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from _results import write_results

from autoplan.errors import PlanError
from autoplan.profile import load_profile
from autoplan.solve.api import plan_graph
from autoplan.trace import trace_model_file

ROOT = Path(__file__).resolve().parents[1]
MODELS = [  # name, model file, env overrides, clusters (devices, batch)
    (
        "GPT 1.3B",
        "examples/gpt.py",
        dict(N_LAYER=24, N_EMBD=2048, N_HEAD=16, VOCAB_SIZE=51200, BLOCK_SIZE=2048),
        [(8, 64), (64, 512)],
    ),
    (
        "GPT 6.7B",
        "examples/gpt.py",
        dict(N_LAYER=32, N_EMBD=4096, N_HEAD=32, VOCAB_SIZE=51200, BLOCK_SIZE=2048),
        [(8, 64), (64, 512)],
    ),
    (
        "GPT 13B",
        "examples/gpt.py",
        dict(N_LAYER=40, N_EMBD=5120, N_HEAD=40, VOCAB_SIZE=51200, BLOCK_SIZE=2048),
        [(64, 512), (256, 1024)],
    ),
    ("GPT-3 175B", "examples/gpt3_175b.py", {}, [(512, 1536), (1024, 1536)]),
]


def traced(model_file: str, env: dict, batch: int):
    saved = {k: os.environ.get(f"AUTOPLAN_GPT_{k}") for k in env}
    os.environ.update({f"AUTOPLAN_GPT_{k}": str(v) for k, v in env.items()})
    try:
        return trace_model_file(ROOT / model_file, batch)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(f"AUTOPLAN_GPT_{k}", None)
            else:
                os.environ[f"AUTOPLAN_GPT_{k}"] = v


def best_or_none(graph, profile, devices: int, batch: int, fix: dict | None):
    try:
        return plan_graph(graph, devices=devices, profile=profile, batch_size=batch, fix=fix).best
    except PlanError:
        return None


def megatron(graph, profile, devices: int, batch: int):
    tp = min(profile.devices_per_node, devices)
    for pp in (p for p in range(1, len(graph.layers) + 1) if (devices // tp) % p == 0):
        pins = {"tp": tp, "pp": pp, "sp": True, "schedule": "1f1b"}
        if devices // (tp * pp) > 1:
            pins["zero"] = 1  # the distributed optimizer needs data parallelism
        found = best_or_none(graph, profile, devices, batch, pins)
        if found is not None:
            return found
    return None


def compare(name: str, graph, profile, devices: int, batch: int) -> dict:
    plans = {
        "autoplan": best_or_none(graph, profile, devices, batch, None),
        "megatron": megatron(graph, profile, devices, batch),
        "fsdp": best_or_none(graph, profile, devices, batch, {"tp": 1, "pp": 1, "zero": 3}),
        "dp": best_or_none(graph, profile, devices, batch, {"tp": 1, "pp": 1, "zero": 0}),
    }
    row = {"model": name, "params_b": graph.param_count / 1e9, "devices": devices, "batch": batch}
    for key, plan in plans.items():
        row[f"{key}_samples_per_s"] = plan.predicted.samples_per_s if plan else None
        row[f"{key}_mfu"] = plan.predicted.mfu if plan else None
        row[f"{key}_plan"] = plan.describe() if plan else "does not fit"
    base = row["autoplan_samples_per_s"]
    for key in ("megatron", "fsdp", "dp"):
        other = row[f"{key}_samples_per_s"]
        row[f"speedup_vs_{key}"] = base / other if base and other else None
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="only the two smallest models")
    args = parser.parse_args()
    profile = load_profile("dgx-a100")
    rows = []
    for name, model_file, env, clusters in MODELS[:2] if args.quick else MODELS:
        graph = traced(model_file, env, clusters[0][1])
        for devices, batch in clusters:
            rows.append(compare(name, graph, profile, devices, batch))
            print(f"done {name} on {devices}", flush=True)
    _print(rows)
    write_results(rows, "plan_quality")


def _fmt(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _print(rows: list[dict]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="predicted samples/s (MFU): autoplan vs rules of thumb, dgx-a100")
    for column in (
        "model",
        "devices",
        "batch",
        "autoplan",
        "Megatron rule",
        "FSDP",
        "pure DP",
        "x Megatron",
        "x FSDP",
        "autoplan plan",
    ):
        table.add_column(column, no_wrap=True)
    for r in rows:
        cells = [
            f"{_fmt(r[f'{k}_samples_per_s'], '.1f')} ({_fmt(r[f'{k}_mfu'], '.0%')})"
            for k in ("autoplan", "megatron", "fsdp", "dp")
        ]
        table.add_row(
            r["model"],
            str(r["devices"]),
            str(r["batch"]),
            *cells,
            _fmt(r["speedup_vs_megatron"], ".2f"),
            _fmt(r["speedup_vs_fsdp"], ".2f"),
            r["autoplan_plan"],
        )
    Console(width=220).print(table)


if __name__ == "__main__":
    main()
