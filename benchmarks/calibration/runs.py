"""Run each plan with `autoplan run` (one subprocess per plan, as a user would), resumably."""

from __future__ import annotations

import csv
import json
import os
import statistics
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from autoplan.types.plan import Plan


@dataclass
class Measured:
    folder: Path
    plan: Plan
    measured_s: float | None
    error: str = ""
    spread_pct: float | None = None  # interquartile range of the timed steps / their median, in %
    predicted_peak_bytes: float | None = None  # the audit's priced peak, the largest over ranks
    measured_peak_bytes: float | None = None  # the audit's peak live tensor bytes, the largest over ranks


def slug(key: str) -> str:
    return key.replace("schedule=", "").replace(",", "-").replace("=", "")


def run_plan(
    *, model_file: str, env: dict[str, str], plan: Plan, folder: Path, steps: int, fresh: bool, timeout_s: float
) -> Measured:
    """Write the plan, run it for ``steps`` steps (unless a finished run of as many steps is there), read the median."""
    folder.mkdir(parents=True, exist_ok=True)
    summary = folder / "summary.json"
    if (
        not fresh
        and summary.is_file()
        and (folder / "audit.csv").is_file()
        and json.loads(summary.read_text()).get("steps", 0) >= steps
    ):
        return _read(folder, plan)
    plan_path = plan.save(folder / "plan.json")
    command = [
        sys.executable,
        "-m",
        "autoplan.cli",
        "run",
        model_file,
        "--plan",
        str(plan_path),
        "--steps",
        str(steps),
        "--out",
        str(folder),
        "--audit",
        "--quiet",
    ]
    try:
        done = subprocess.run(command, env={**os.environ, **env}, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return Measured(folder=folder, plan=plan, measured_s=None, error=f"timed out after {timeout_s:.0f} s")
    if done.returncode != 0:
        lines = (done.stderr or done.stdout).strip().splitlines()
        return Measured(
            folder=folder, plan=plan, measured_s=None, error=lines[-1] if lines else f"exit {done.returncode}"
        )
    return _read(folder, plan)


def _read(folder: Path, plan: Plan) -> Measured:
    data = json.loads((folder / "summary.json").read_text())
    predicted, measured = _peaks(folder / "audit.csv")
    return Measured(
        folder=folder,
        plan=plan,
        measured_s=data.get("median_step_time_s"),
        spread_pct=_spread_pct(folder / "measured.csv", skip=data.get("warmup_steps", 0)),
        predicted_peak_bytes=predicted,
        measured_peak_bytes=measured,
    )


def _peaks(path: Path) -> tuple[float | None, float | None]:
    """(priced, measured) peak live memory from audit.csv, each the largest over ranks (the
    measurement that decides an out-of-memory; the untimed audit step runs after the timed ones)."""
    if not path.is_file():
        return None, None
    with path.open() as handle:
        rows = [r for r in csv.DictReader(handle) if r["what"] == "peak live memory"]
    if not rows:
        return None, None
    return max(float(r["predicted"]) for r in rows), max(float(r["measured"]) for r in rows)


def _spread_pct(path: Path, *, skip: int) -> float | None:
    with path.open() as handle:
        times = [float(row["step_time_s"]) for row in csv.DictReader(handle)][skip:]
    if len(times) < 2:
        return None
    q1, _, q3 = statistics.quantiles(times, n=4)
    return (q3 - q1) / statistics.median(times) * 100.0
