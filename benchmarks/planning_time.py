"""Planning time, model file -> plan.json, on this machine, against issue 38's targets.

The cases: a 4-layer GPT (examples/gpt.py: hidden 512, 8 heads, vocab 32000, seq 512) on 8
devices with batch 16 (target 2 s, start-up included); GPT-3 175B (examples/gpt3_175b.py) on 1,024
GPUs of the dgx-a100 profile with global batch 1536, and Narayanan et al.'s GPT-1T
(examples/gpt_megatron.py at 128 layers, hidden 25600; traced through torch.export) on 3,072 and
4,096 GPUs (target 5 s: dense models up to 1T parameters on up to 4,096 devices); DeepSeek-V3 at
its published size (examples/hf_deepseek_v3.py, 671B, 256 routed experts top-8) with its global
batch of 15,360 sequences on 2,048 GPUs of the dgx-h100 profile (target 10 s).

Each case is timed end to end as a user runs it (``autoplan plan ...`` in a fresh process: Python
start-up, imports, trace, search, writing the files) twice: traced with nothing cached
(``AUTOPLAN_TRACE_CACHE=off``, ``AUTOPLAN_SEARCH_CACHE=off``) and with its trace in the trace cache and its
schedules' analyses in the search cache (warm caches in a temporary folder: the user's second plan of the same
model on the same cluster). With ``--baseline REV`` each case also runs in a temporary ``git worktree`` of
REV (on PYTHONPATH, the same model files), alternating with this tree run by run, and the table shows
both and the ratio. Then it is timed in one process phase by phase (trace, search, write). Times are
wall seconds and user CPU seconds (on a shared machine wall time also counts waiting for a core);
the minimum over ``--repeats`` is reported. Prints a table; writes benchmarks/results/planning_time.csv.
``autoplan plan`` searches on its default processes (``--jobs`` 0: one per core, at most 4; solve/shares.py), and
so does the in-process search phase (with no search cache); user CPU counts the search's child processes. Each
tree's autoplan is compiled to bytecode first and runs with ``PYTHONDONTWRITEBYTECODE`` dropped, as an installed
autoplan has its modules compiled: else every run compiles them again from source (~0.15 s).

    python benchmarks/planning_time.py [--repeats N] [--baseline REV] [--cases NAME,...]
"""

from __future__ import annotations

import argparse
import contextlib
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
        "target_s": 5.0,
    },
    {
        "name": "GPT 4L h512",
        "model": "examples/gpt.py",
        "devices": 8,
        "profile": "dgx-a100",
        "batch": 16,
        "target_s": 2.0,
    },
    {
        "name": "GPT-1T",
        "model": "examples/gpt_megatron.py",
        "devices": 3072,
        "profile": "dgx-a100",
        "batch": 3072,
        "target_s": 5.0,
        "env": GPT_1T,
    },
    {
        "name": "GPT-1T",
        "model": "examples/gpt_megatron.py",
        "devices": 4096,
        "profile": "dgx-a100",
        "batch": 4096,
        "target_s": 5.0,
        "env": GPT_1T,
    },
    {
        "name": "DeepSeek-V3",
        "model": "examples/hf_deepseek_v3.py",
        "devices": 2048,
        "profile": "dgx-h100",
        "batch": 15360,
        "target_s": 10.0,
    },
]


def end_to_end_s(case: dict, out: Path, *, tree: Path = ROOT, cache: Path | None = None) -> tuple[float, float]:
    """(wall s, user CPU s) of one ``autoplan plan`` process running ``tree``'s autoplan on this
    tree's model file, traced with nothing cached (``cache`` None) or with the trace cache in ``cache`` and the
    search cache (cost/stored.py) in its ``search`` folder."""
    command = [sys.executable, "-m", "autoplan.cli", "plan", str(ROOT / case["model"])]
    for flag in ("devices", "profile", "batch"):
        command += [f"--{flag}", str(case[flag])]
    env = {**os.environ, **case.get("env", {}), "PYTHONPATH": str(tree)}
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # read the bytecode compiled() wrote (module docstring)
    env["AUTOPLAN_TRACE_CACHE"] = str(cache) if cache else "off"
    env["AUTOPLAN_SEARCH_CACHE"] = str(cache / "search") if cache else "off"
    user_before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_utime
    start = time.perf_counter()
    subprocess.run([*command, "--out", str(out), "--quiet"], check=True, cwd=tree, env=env)
    return time.perf_counter() - start, resource.getrusage(resource.RUSAGE_CHILDREN).ru_utime - user_before


def compiled(tree: Path) -> Path:
    """``tree`` with its autoplan package compiled to bytecode, as pip installs it."""
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(tree / "autoplan")], check=True)
    return tree


@contextlib.contextmanager
def baseline_tree(rev: str | None, tmp: Path):
    """A temporary ``git worktree`` of ``rev`` (None: no baseline), removed on the way out."""
    if rev is None:
        yield None
        return
    tree = tmp / "baseline"
    subprocess.run(["git", "worktree", "add", "--detach", str(tree), rev], check=True, cwd=ROOT, capture_output=True)
    try:
        yield compiled(tree)
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(tree)], check=True, cwd=ROOT)


def end_to_end(case: dict, tmp: Path, *, repeats: int, baseline: Path | None) -> dict:
    """The case's end-to-end times, each the minimum of ``repeats``, the trees alternating run by run."""
    cache = tmp / f"cache-{case['name']}-{case['devices']}".replace(" ", "_")
    end_to_end_s(case, tmp / "warm", cache=cache)  # the user's first plan: fills the cache
    runs: dict[str, list[tuple[float, float]]] = {"traced": [], "cached": [], "baseline": []}
    for _ in range(repeats):
        if baseline is not None:
            runs["baseline"].append(end_to_end_s(case, tmp / "base", tree=baseline))
        runs["traced"].append(end_to_end_s(case, tmp / "e2e"))
        runs["cached"].append(end_to_end_s(case, tmp / "e2e", cache=cache))
    row = {}
    for name, times in runs.items():
        if times:
            row[f"{name}_s"], row[f"{name}_user_s"] = min(times)
    if baseline is not None:
        row["traced_ratio"] = row["traced_user_s"] / row["baseline_user_s"]
        row["cached_ratio"] = row["cached_user_s"] / row["baseline_user_s"]
    return row


def phases_s(case: dict, out: Path) -> dict:
    from autoplan.cli.startup import paused_collector
    from autoplan.profile import load_profile
    from autoplan.solve.api import plan_graph
    from autoplan.solve.outputs import write_outputs
    from autoplan.trace import trace_model_file

    profile = load_profile(case["profile"])
    clocks = [(time.perf_counter(), _user_s())]
    with paused_collector():  # as `autoplan plan` traces and searches (cli/startup.py): later phases skip the heap
        graph = trace_model_file(ROOT / case["model"], case["batch"])
    clocks.append((time.perf_counter(), _user_s()))
    with paused_collector():
        result = plan_graph(graph, devices=case["devices"], profile=profile, batch_size=case["batch"], jobs=0)
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
        "processes": result.processes,
        "ilp_status": result.ilp_status,
        "plan": result.best.describe(),
    }


def _user_s() -> float:
    """This process's user CPU and its reaped children's: the search's shares (solve/shares.py) are children."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_utime + resource.getrusage(resource.RUSAGE_CHILDREN).ru_utime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--repeats", type=int, default=1, help="end-to-end runs per case and tree (the minimum is reported)"
    )
    parser.add_argument("--baseline", metavar="REV", help="also run REV's autoplan (a git revision), alternating")
    parser.add_argument("--cases", help="comma-separated case names to run (default: all)")
    args = parser.parse_args()
    import torch._dynamo  # noqa: F401  (import torch, the tracer and the planner once, outside the in-process timings)

    import autoplan.solve.api  # noqa: F401
    import autoplan.trace.api  # noqa: F401
    from autoplan.calibrate.runs import environment

    compiled(ROOT)
    wanted = {name.strip() for name in args.cases.split(",")} if args.cases else None
    rows = []
    with tempfile.TemporaryDirectory() as tmp, baseline_tree(args.baseline, Path(tmp)) as base:
        for case in CASES:
            if wanted is not None and case["name"] not in wanted:
                continue
            with environment(tuple(case.get("env", {}).items())):
                row = {
                    "case": case["name"],
                    "devices": case["devices"],
                    "batch": case["batch"],
                    "baseline": args.baseline or "",
                    "target_s": case["target_s"],
                    **end_to_end(case, Path(tmp), repeats=args.repeats, baseline=base),
                    **phases_s(case, Path(tmp) / "phases"),
                }
            rows.append(row)
    _print(rows)
    write_results(rows, "planning_time")


def _print(rows: list[dict]) -> None:
    from rich.console import Console
    from rich.table import Table

    baseline = rows[0]["baseline"] if rows else ""
    table = Table(title="planning time: model file -> plan.json, end to end (user CPU s in brackets)")
    columns = ["case", "devices", "target s"]
    columns += [f"{baseline} s", "traced s", "ratio", "cached s", "ratio"] if baseline else ["traced s", "cached s"]
    columns += ["trace s", "search s", "write s", "priced", "pruned", "ILPs", "processes", "plan"]
    for name in columns:
        table.add_column(name, no_wrap=True)
    both = lambda r, k: f"{r[k + '_s']:.2f} ({r[k + '_user_s']:.2f})"  # noqa: E731
    for r in rows:
        times = [both(r, "traced"), both(r, "cached")]
        if baseline:
            times = [both(r, "baseline"), times[0], f"{r['traced_ratio']:.2f}", times[1], f"{r['cached_ratio']:.2f}"]
        table.add_row(
            r["case"],
            str(r["devices"]),
            f"{r['target_s']:.0f}",
            *times,
            both(r, "trace"),
            both(r, "search"),
            both(r, "write"),
            str(r["evaluated"]),
            str(r["pruned"]),
            str(r["ilp_solves"]),
            str(r["processes"]),
            r["plan"],
        )
    Console(width=240).print(table)


if __name__ == "__main__":
    main()
