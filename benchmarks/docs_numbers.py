"""Regenerate every measured or predicted number that docs/ quotes, from committed result files.

    python benchmarks/docs_numbers.py            # rewrite each generated block in docs/
    python benchmarks/docs_numbers.py --check    # exit 1, naming each block that differs (a test runs this)

A generated block in a doc reads

    <!-- numbers: NAME (python benchmarks/docs_numbers.py) -->
    ... text rendered from the block's source file ...
    <!-- /numbers: NAME -->

and ``BLOCKS`` names, for each NAME, the committed file it is rendered from (benchmarks/results/,
written by the benchmark script named there) and the function that renders it. To change a
number in docs/, re-run the benchmark, then this script: never edit a block by hand.
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import yaml

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Block:
    doc: str  # under docs/
    source: str  # relative to the repository root
    made_by: str  # the command that writes the source
    render: Callable[[Path], str]


def _table(header: list[str], rows: list[list[str]], align: str | None = None) -> str:
    align = align or "|".join("---" if i == 0 else "---:" for i in range(len(header)))
    lines = ["| " + " | ".join(header) + " |", "|" + align + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def _pct(x: float, signed: bool = True) -> str:
    return f"{x:+.1f}%" if signed else f"{x:.1f}%"


def published_runs(path: Path) -> str:
    """Narayanan et al. Table 1 and Korthikanti et al. Tables 3-4 (the 18 PTD-P rows), then the
    summary of their errors."""
    runs = pd.read_csv(path)
    table1 = runs[~runs["run"].str.contains("-t2-")]
    rows = [
        [r.run, f"{r.published_step_s:.4g}", f"{r.predicted_step_s:.4g}", _pct(r.error_pct)]
        for r in table1.itertuples()
    ]
    err = table1["error_pct"].abs()
    within = int((err <= 10).sum())
    summary = (
        f"Mean |error| {err.mean():.1f}%, max {err.max():.1f}% ({within} of {len(table1)} within 10%), "
        f"as `benchmarks/results/published_runs.csv` has them."
    )
    return _table(["run", "published step s", "predicted step s", "error"], rows) + "\n\n" + summary


def published_zero3(path: Path) -> str:
    """Narayanan et al. Table 2: ZeRO-3 against PTD-P for GPT-175B."""
    runs = pd.read_csv(path)
    t2 = runs[runs["run"].str.contains("-t2-")]
    rows = [
        [r.run, f"{r.published_step_s:.5g}", f"{r.predicted_step_s:.5g}", _pct(r.error_pct), f"{r.mfu:.3f}"]
        for r in t2.itertuples()
    ]
    return _table(["run", "published step s", "predicted s", "error", "predicted MFU"], rows)


def goodput(path: Path) -> str:
    rows = [
        [
            r.profile,
            r.model,
            f"{r.devices:,}",
            f"{r.write_s:.2f}",
            f"{r.job_mtbf_h:.2f}",
            f"{r.young_interval_s:.0f}",
            f"{r.daly_interval_s:.0f}",
            f"{100 * r.goodput:.1f}%",
            f"{r.lost_h_per_day:.2f}",
            f"{100 * r.async_goodput:.1f}%",
        ]
        for r in pd.read_csv(path).itertuples()
    ]
    header = ["profile", "model", "devices", "write s", "job MTBF h", "Young τ s", "Daly τ s", "goodput"]
    return _table(header + ["lost h/day", "goodput, async"], rows, align="---|---" + "|---:" * 8)


def _millions(x: float) -> str:
    return f"{x / 1e6:.3g}M"


def whole_run_hours(path: Path) -> str:
    runs = pd.read_csv(path)
    priced = runs[runs["predicted_gpu_hours"].notna()]
    rows = [
        [
            r.run,
            r.hardware,
            f"{r.tokens / 1e12:.3g}T",
            _millions(r.published_gpu_hours),
            _millions(r.predicted_gpu_hours),
            f"{_millions(r.predicted_gpu_hours_with_goodput)} (goodput {100 * r.goodput:.1f}%)",
            f"{r.ratio:.2f}",
            f"{r.ratio_with_goodput:.2f}",
        ]
        for r in priced.itertuples()
    ]
    header = ["run", "hardware", "tokens", "published GPU-hours", "predicted", "predicted / goodput", "ratio"]
    return _table(header + ["ratio with goodput"], rows, align="---|---" + "|---:" * 6)


def _dash(x: float) -> str:
    return "—" if pd.isna(x) or x == 0 else f"{x:.2f}"


def whole_run_steps(path: Path) -> str:
    runs = pd.read_csv(path)
    priced = runs[runs["predicted_gpu_hours"].notna()]
    rows = [
        [
            r.run,
            f"{r.step_s:.2f}",
            _dash(r.published_implied_step_s),
            _dash(r.throughput_implied_step_s),
            f"{r.compute_s:.2f}",
            f"{r.bubble_s:.2f}",
            f"{r.pp_s:.2f}",
            _dash(r.tp_s),
            _dash(r.ep_s),
            f"{r.peak_GiB:.0f} GiB",
            "yes" if r.fits else "no",
            "—" if r.fits else f"{r.step_s_if_fits:.2f} ({r.recompute_if_fits})",
        ]
        for r in priced.itertuples()
    ]
    header = ["run", "predicted step", "implied by whole-run hours", "implied by published TFLOP/s"]
    header += ["compute (+ recompute)", "bubble", "pp sends", "tp (exposed)", "ep all-to-all"]
    header += ["autoplan peak memory", "fits?", "step if recompute until it fits"]
    return _table(header, rows, align="---" + "|---:" * 9 + "|---|---:")


def checkpoint_io(path: Path) -> str:
    rows = [
        [
            r.size,
            f"{r.params / 1e6:.2g} M",
            f"{r.checkpoint_mb:.1f}",
            f"{r.measured_over_predicted:.3f}",
            f"{r.save_s:.3f}",
            f"{r.save_mb_per_s:.0f}",
            f"{r.load_s:.3f}",
            f"{r.load_mb_per_s:.0f}",
            f"{r.async_block_s:.3f}",
        ]
        for r in pd.read_csv(path).itertuples()
    ]
    header = ["size", "parameters", "checkpoint MB", "measured / predicted bytes", "save s", "save MB/s", "load s"]
    table = _table(header + ["load MB/s", "async blocking s"], rows)
    steps = pd.read_csv(path.with_name("checkpoint_io_async.csv")).set_index("checkpoint")
    modes = "; ".join(
        f"{mode} {steps.loc[mode, 'mean_step_s']:.3f} s mean (x{steps.loc[mode, 'mean_ratio']:.2f}"
        + (f", each save call blocks {steps.loc[mode, 'median_save_call_s']:.2f} s)" if mode != "none" else ")")
        for mode in ("none", "sync", "async")
    )
    size, every = steps.loc["sync", "size"], steps.loc["sync", "every"]
    return table + f"\n\nStep time of size {size} with a checkpoint every {every} steps: {modes}."


def executor_overhead(path: Path) -> str:
    runs = pd.read_csv(path).set_index("loop")
    ddp, ours = runs.loc["ddp"], runs.loc["autoplan"]
    return (
        f"{ours.model}, batch {ours.batch}, {ours.steps} timed steps each: hand-written DDP "
        f"{ddp.median_step_time_s:.4f} s/step, autoplan {ours.median_step_time_s:.4f} s/step, "
        f"ratio {ours.ratio_to_ddp:.2f} (target <= 1.05)."
    )


def hang_detection(path: Path) -> str:
    runs = pd.read_csv(path)
    median = runs.groupby("mode").stopped_after_s.median()
    causes = runs.groupby("mode").cause.agg(lambda values: "/".join(sorted(set(values))))
    return (
        f"From rank 1's hang to `autoplan run`'s exit, the median of {runs.groupby('mode').size().min()} runs each, "
        f"alternating: {median['collective timeout only']:.1f} s with the collective timeout alone "
        f"(`--hang-timeout-s 0`, as before the heartbeat; stopped by: {causes['collective timeout only']}), "
        f"{median['heartbeat']:.1f} s with the heartbeat (deadline 10 s; stopped by: {causes['heartbeat']})."
    )


def gpu_check(path: Path) -> str:
    runs = pd.read_csv(path)
    rows = [
        [
            r.case,
            f"{1e3 * r.measured_step_s:.2f} ms",
            f"{1e3 * r.predicted_step_s:.2f} ms",
            f"{r.measured_over_predicted:.2f}",
            f"{r.peak_memory_bytes / 2**30:.1f} GiB",
        ]
        for r in runs.itertuples()
    ]
    device = yaml.safe_load((path.parent / "profile.yaml").read_text())["device"]
    peaks = ", ".join(f"{dtype} {flops / 1e12:,.0f}" for dtype, flops in device["peak_flops"].items())
    overhead = device.get("op_overhead") or {}
    profile = (
        f"The measured profile ({device['name']}): peak TFLOP/s {peaks}; memory "
        f"{device['memory_bandwidth_bytes_per_s'] / 1e12:.2f} TB/s; host overhead "
        f"{1e6 * overhead.get('forward_s', 0):.1f} us per forward op and {1e6 * overhead.get('backward_s', 0):.1f} us "
        f"per backward op."
    )
    header = ["case", "measured step", "predicted step", "measured / predicted", "peak memory"]
    return _table(header, rows) + "\n\n" + profile


def audit(path: Path) -> str:
    """benchmarks/audit.py's families: each collective as priced, FLOPs and memory against the price."""
    runs = pd.read_csv(path)
    rows = [
        [
            r.family,
            f"`{r.plan}`",
            f"{r.as_priced:.0f}/{r.collective_rows:.0f}",
            f"{r.max_comm_error_pct:.1f}%",
            f"{r.max_matmul_flops_error_pct:.1f}%",
            f"{r.peak_memory_error_pct:+.1f}%",
        ]
        if str(r.exit) == "0"
        else [r.family, f"`{r.plan}`", "run failed", "", "", ""]
        for r in runs.itertuples()
    ]
    runs = runs[runs.exit.astype(str) == "0"]
    exact = runs[runs.as_priced == runs.collective_rows]
    summary = (
        f"{len(rows)} families, {len(runs)} ran; {len(exact)} have every collective as priced, with peak memory "
        f"{exact.peak_memory_error_pct.abs().min():.0f}-{exact.peak_memory_error_pct.abs().max():.0f}% from the "
        f"prediction."
    )
    header = ["family", "plan", "collectives as priced", "max comm error", "max matmul FLOPs error", "peak memory"]
    return _table(header, rows, align="---|---|---:|---:|---:|---:") + "\n\n" + summary


def audit_families(path: Path) -> str:
    """How many plan families the audit runs (tests/dist/audit_cases.py: CASES on 2 ranks, FOUR on 4), each
    checked by tests/dist/test_audit.py."""
    counts = {}
    for node in ast.parse(path.read_text()).body:
        target = node.targets[0] if isinstance(node, ast.Assign) else getattr(node, "target", None)
        if getattr(target, "id", None) in ("CASES", "FOUR"):
            counts[target.id] = len(node.value.elts)
    two, four = counts["CASES"], counts["FOUR"]
    return (
        f"`tests/dist/test_audit.py` audits {two + four} plan families (tests/dist/audit_cases.py) on real gloo "
        f"groups of 2 and 4 ranks "
        f"({two} and {four}, `CASES` and `FOUR`):"
    )


BLOCKS = {
    "published_runs": Block(
        "cost-model.md", "benchmarks/results/published_runs.csv", "python benchmarks/published_runs.py", published_runs
    ),
    "published_zero3": Block(
        "cost-model.md", "benchmarks/results/published_runs.csv", "python benchmarks/published_runs.py", published_zero3
    ),
    "goodput": Block("cost-model.md", "benchmarks/results/goodput.csv", "python benchmarks/goodput.py", goodput),
    "whole_run_hours": Block(
        "whole-run-checks.md",
        "benchmarks/results/whole_run_hours.csv",
        "python benchmarks/whole_run_hours.py",
        whole_run_hours,
    ),
    "whole_run_steps": Block(
        "whole-run-checks.md",
        "benchmarks/results/whole_run_hours.csv",
        "python benchmarks/whole_run_hours.py",
        whole_run_steps,
    ),
    "checkpoint_io": Block(
        "elastic.md", "benchmarks/results/checkpoint_io.csv", "python benchmarks/checkpoint_io.py", checkpoint_io
    ),
    "executor_overhead": Block(
        "executor.md",
        "benchmarks/results/executor_overhead.csv",
        "python benchmarks/executor_overhead.py",
        executor_overhead,
    ),
    "hang_detection": Block(
        "executor.md", "benchmarks/results/hang_detection.csv", "python benchmarks/hang_detection.py", hang_detection
    ),
    "audit": Block("cost-model.md", "benchmarks/results/audit.csv", "python benchmarks/audit.py", audit),
    "audit_families": Block("cost-model.md", "tests/dist/audit_cases.py", "the cases file itself", audit_families),
    "gpu_check": Block(
        "calibration.md", "benchmarks/results/gpu_check/summary.csv", "benchmarks/gpu_check.sh (on a GPU)", gpu_check
    ),
}


def _pattern(name: str) -> re.Pattern[str]:
    return re.compile(rf"<!-- numbers: {name} [^\n]*-->\n.*?<!-- /numbers: {name} -->", re.DOTALL)


def rendered(name: str, block: Block) -> str:
    return block.render(ROOT / block.source)


def apply(name: str, block: Block, text: str) -> str:
    """``text`` (a doc) with block ``name`` re-rendered; a doc without the block is an error."""
    pattern = _pattern(name)
    if not pattern.search(text):
        raise SystemExit(f"docs/{block.doc} has no block '{name}'; add its markers (module docstring).")
    header = f"<!-- numbers: {name} (from {block.source}: {block.made_by}) -->\n"
    body = header + rendered(name, block) + f"\n<!-- /numbers: {name} -->"
    return pattern.sub(lambda _: body, text, count=1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if a block differs")
    args = parser.parse_args(argv)
    stale = []
    for doc in sorted({b.doc for b in BLOCKS.values()}):
        path = ROOT / "docs" / doc
        before = path.read_text()
        after = before
        for name, block in BLOCKS.items():
            if block.doc == doc:
                new = apply(name, block, after)
                if new != after:
                    stale.append(f"docs/{doc}: block '{name}' differs from {block.source}")
                after = new
        if after != before and not args.check:
            path.write_text(after)
    for line in stale:
        print(("stale: " if args.check else "rewrote: ") + line)
    if args.check and stale:
        print("run `python benchmarks/docs_numbers.py` to regenerate them.")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
