"""Planning time, model file -> plan.json, on this machine.

Two cases from the planner issue: GPT-3 175B (examples/gpt3_175b.py) on 1,024 GPUs of the
dgx-a100 profile with global batch 1536 (target < 10 s), and a 4-layer GPT (examples/gpt.py:
hidden 512, 8 heads, vocab 32000, seq 512) on 8 devices with batch 16 (target < 3 s), and
Narayanan et al.'s GPT-1T (examples/gpt_megatron.py at 128 layers, hidden 25600) on 3,072 and
4,096 GPUs, free plan (target < 10 s). That model's attention splits q/k/v with a generator,
which torch.fx cannot trace, so it goes through torch.export: most of its time is the export.
The MoE issue's case: DeepSeek-V3 at its published size (examples/hf_deepseek_v3.py, 671B, 61
layers, 256 routed experts top-8) with its global batch of 15,360 sequences on 2,048 GPUs of the
dgx-h100 profile (target <= 20 s). It fits on H100s only with expert parallelism, which the
search now prices (ep folded over dp; the best plan splits the experts 128 ways).

Each case is timed twice: end to end as a user runs it (``autoplan plan ...`` in a fresh
process: Python start-up, ``import torch``, tracing, search, writing the files), and in one
process phase by phase (trace, search, write). Each time is reported as wall seconds and as
user CPU seconds (the process's own work: on a shared machine wall time also counts waiting for
a core). Prints a table; writes benchmarks/results/planning_time.csv.

    python benchmarks/planning_time.py [--repeats N]
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _results import write_results

ROOT = Path(__file__).resolve().parents[1]
GPT_1T = {
    "AUTOPLAN_GPTM_N_LAYER": "128",
    "AUTOPLAN_GPTM_N_EMBD": "25600",
    "AUTOPLAN_GPTM_N_HEAD": "160",
    "AUTOPLAN_GPTM_SEQ_LEN": "2048",
    "AUTOPLAN_GPTM_VOCAB_SIZE": "51200",
}  # Narayanan et al. 2021's 1T GPT
CASES = [
    {
        "name": "GPT-3 175B",
        "model": "examples/gpt3_175b.py",
        "devices": 1024,
        "profile": "dgx-a100",
        "batch": 1536,
        "target_s": 10.0,
    },
    {
        "name": "GPT 4L h512",
        "model": "examples/gpt.py",
        "devices": 8,
        "profile": "dgx-a100",
        "batch": 16,
        "target_s": 3.0,
    },
    {
        "name": "GPT-1T",
        "model": "examples/gpt_megatron.py",
        "devices": 3072,
        "profile": "dgx-a100",
        "batch": 3072,
        "target_s": 10.0,
        "env": GPT_1T,
    },
    {
        "name": "GPT-1T",
        "model": "examples/gpt_megatron.py",
        "devices": 4096,
        "profile": "dgx-a100",
        "batch": 4096,
        "target_s": 10.0,
        "env": GPT_1T,
    },
    {
        "name": "DeepSeek-V3",
        "model": "examples/hf_deepseek_v3.py",
        "devices": 2048,
        "profile": "dgx-h100",
        "batch": 15360,
        "target_s": 20.0,
    },
]


def end_to_end_s(case: dict, out: Path) -> tuple[float, float]:
    """(wall s, user CPU s) of one ``autoplan plan`` process."""
    command = [
        sys.executable,
        "-m",
        "autoplan.cli",
        "plan",
        str(ROOT / case["model"]),
        "--devices",
        str(case["devices"]),
        "--profile",
        case["profile"],
        "--batch",
        str(case["batch"]),
        "--out",
        str(out),
        "--quiet",
    ]
    user_before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_utime
    start = time.perf_counter()
    subprocess.run(command, check=True, cwd=ROOT, env={**os.environ, **case.get("env", {})})
    return time.perf_counter() - start, resource.getrusage(resource.RUSAGE_CHILDREN).ru_utime - user_before


def phases_s(case: dict, out: Path) -> dict:
    from autoplan.calibrate.runs import environment
    from autoplan.profile import load_profile
    from autoplan.solve.api import plan_graph
    from autoplan.solve.outputs import write_outputs
    from autoplan.trace import trace_model_file

    profile = load_profile(case["profile"])
    clocks = [(time.perf_counter(), _user_s())]
    with environment(tuple(case.get("env", {}).items())):
        graph = trace_model_file(ROOT / case["model"], case["batch"])
    clocks.append((time.perf_counter(), _user_s()))
    result = plan_graph(graph, devices=case["devices"], profile=profile, batch_size=case["batch"])
    clocks.append((time.perf_counter(), _user_s()))
    write_outputs(out, result=result, graph=graph, profile=profile)
    clocks.append((time.perf_counter(), _user_s()))
    times = {}
    for i, phase in enumerate(("trace", "search", "write")):
        times[f"{phase}_s"] = clocks[i + 1][0] - clocks[i][0]
        times[f"{phase}_user_s"] = clocks[i + 1][1] - clocks[i][1]
    return {
        **times,
        "in_process_s": clocks[-1][0] - clocks[0][0],
        "evaluated": result.evaluated,
        "pruned": result.pruned,
        "ilp_solves": result.ilp_solves,
        "ilp_status": result.ilp_status,
        "plan": result.best.describe(),
    }


def _user_s() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_utime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=1, help="end-to-end runs per case (the minimum is reported)")
    args = parser.parse_args()
    import autoplan.cli  # noqa: F401  (import torch and the planner once, outside the in-process timings)

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for case in CASES:
            e2e, e2e_user = min(end_to_end_s(case, Path(tmp) / "e2e") for _ in range(args.repeats))
            row = {
                "case": case["name"],
                "devices": case["devices"],
                "batch": case["batch"],
                "end_to_end_s": e2e,
                "end_to_end_user_s": e2e_user,
                "target_s": case["target_s"],
                **phases_s(case, Path(tmp) / "phases"),
            }
            rows.append(row)
    _print(rows)
    write_results(rows, "planning_time")


def _print(rows: list[dict]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="planning time: model file -> plan.json")
    for name in (
        "case",
        "devices",
        "end-to-end s (user)",
        "target s",
        "trace s (user)",
        "search s (user)",
        "write s (user)",
        "priced",
        "pruned",
        "ILPs",
        "plan",
    ):
        table.add_column(name, no_wrap=True)
    both = lambda r, k: f"{r[k + '_s']:.2f} ({r[k + '_user_s']:.2f})"  # noqa: E731
    for r in rows:
        table.add_row(
            r["case"],
            str(r["devices"]),
            both(r, "end_to_end"),
            f"{r['target_s']:.0f}",
            both(r, "trace"),
            both(r, "search"),
            both(r, "write"),
            str(r["evaluated"]),
            str(r["pruned"]),
            str(r["ilp_solves"]),
            r["plan"],
        )
    Console(width=200).print(table)


if __name__ == "__main__":
    main()
