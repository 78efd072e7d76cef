"""Planning time, model file -> plan.json, on this machine.

Two cases from the planner issue: GPT-3 175B (examples/gpt3_175b.py) on 1,024 GPUs of the
dgx-a100 profile with global batch 1536 (target < 10 s), and a 4-layer GPT (examples/gpt.py:
hidden 512, 8 heads, vocab 32000, seq 512) on 8 devices with batch 16 (target < 3 s).

Each case is timed twice: end to end as a user runs it (``autoplan plan ...`` in a fresh
process: Python start-up, ``import torch``, tracing, search, writing the files), and in one
process phase by phase (trace, search, write). Prints a table; writes
benchmarks/results/planning_time.csv.

    python benchmarks/planning_time.py [--repeats N]
"""
from __future__ import annotations

import argparse
import csv
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CASES = [
    {"name": "GPT-3 175B", "model": "examples/gpt3_175b.py", "devices": 1024, "profile": "dgx-a100", "batch": 1536, "target_s": 10.0},
    {"name": "GPT 4L h512", "model": "examples/gpt.py", "devices": 8, "profile": "dgx-a100", "batch": 16, "target_s": 3.0},
]


def end_to_end_s(case: dict, out: Path) -> float:
    command = [sys.executable, "-m", "autoplan.cli", "plan", str(ROOT / case["model"]), "--devices", str(case["devices"]),
               "--profile", case["profile"], "--batch", str(case["batch"]), "--out", str(out), "--quiet"]
    start = time.perf_counter()
    subprocess.run(command, check=True, cwd=ROOT)
    return time.perf_counter() - start


def phases_s(case: dict, out: Path) -> dict:
    from autoplan.profile import load_profile
    from autoplan.solve.api import plan_graph
    from autoplan.solve.outputs import write_outputs
    from autoplan.trace import trace_model_file

    profile = load_profile(case["profile"])
    start = time.perf_counter()
    graph = trace_model_file(ROOT / case["model"], case["batch"])
    traced = time.perf_counter()
    result = plan_graph(graph, devices=case["devices"], profile=profile, batch_size=case["batch"])
    searched = time.perf_counter()
    write_outputs(out, result=result, graph=graph, profile=profile)
    written = time.perf_counter()
    return {"trace_s": traced - start, "search_s": searched - traced, "write_s": written - searched,
            "in_process_s": written - start, "evaluated": result.evaluated, "pruned": result.pruned,
            "ilp_solves": result.ilp_solves, "ilp_status": result.ilp_status, "plan": result.best.describe()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=1, help="end-to-end runs per case (the minimum is reported)")
    args = parser.parse_args()
    import autoplan.cli  # noqa: F401  (import torch and the planner once, outside the in-process timings)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for case in CASES:
            e2e = min(end_to_end_s(case, Path(tmp) / "e2e") for _ in range(args.repeats))
            row = {"case": case["name"], "devices": case["devices"], "batch": case["batch"], "end_to_end_s": e2e,
                   "target_s": case["target_s"], **phases_s(case, Path(tmp) / "phases")}
            rows.append(row)
    _print(rows)
    out = ROOT / "benchmarks" / "results" / "planning_time.csv"
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    print(f"wrote {out}")


def _print(rows: list[dict]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="planning time: model file -> plan.json")
    for name in ("case", "devices", "end-to-end s", "target s", "trace s", "search s", "write s", "priced", "pruned", "ILPs", "plan"):
        table.add_column(name, no_wrap=True)
    for r in rows:
        table.add_row(r["case"], str(r["devices"]), f"{r['end_to_end_s']:.2f}", f"{r['target_s']:.0f}", f"{r['trace_s']:.2f}",
                      f"{r['search_s']:.2f}", f"{r['write_s']:.2f}", str(r["evaluated"]), str(r["pruned"]), str(r["ilp_solves"]), r["plan"])
    Console(width=200).print(table)


if __name__ == "__main__":
    main()
