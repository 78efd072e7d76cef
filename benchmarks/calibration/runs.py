"""Run each plan with `autoplan run` (one subprocess per plan, as a user would), resumably."""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from autoplan.errors import RunError
from autoplan.types.plan import Plan
from autoplan.types.run_folder import RunFolder


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
    if not fresh:
        done = _finished(folder, steps)
        if done is not None:
            return _measured(done, plan)
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
    return _measured(RunFolder.read(folder, error=RunError), plan)


def _finished(folder: Path, steps: int) -> RunFolder | None:
    """The run already in ``folder`` when it ran at least ``steps`` steps with the audit; else None."""
    try:
        run = RunFolder.read(folder, error=RunError)
    except RunError:
        return None
    return run if run.audit is not None and (run.summary.steps or 0) >= steps else None


def _measured(run: RunFolder, plan: Plan) -> Measured:
    predicted, measured = _peaks(run)
    return Measured(
        folder=run.path,
        plan=plan,
        measured_s=run.summary.median_step_time_s,
        spread_pct=_spread_pct(run),
        predicted_peak_bytes=predicted,
        measured_peak_bytes=measured,
    )


def _peaks(run: RunFolder) -> tuple[float | None, float | None]:
    """(priced, measured) peak live memory from audit.csv, each the largest over ranks (the
    measurement that decides an out-of-memory; the untimed audit step runs after the timed ones)."""
    if run.audit is None:
        return None, None
    rows = run.audit[run.audit["what"] == "peak live memory"]
    if rows.empty:
        return None, None
    return float(rows["predicted"].astype(float).max()), float(rows["measured"].astype(float).max())


def _spread_pct(run: RunFolder) -> float | None:
    times = (run.step_times_s() or [])[run.summary.warmup_steps or 0 :]
    if len(times) < 2:
        return None
    q1, _, q3 = statistics.quantiles(times, n=4)
    return (q3 - q1) / statistics.median(times) * 100.0
