"""The report's tidy tables (pandas): one observation per row, one variable per column.

- ``plans.csv``: one row per candidate the planner evaluated or pruned, as in the plan
  folder, plus ``family`` (dp, tp, pp), ``peak_memory_gib`` and ``slowdown_vs_best`` (step
  time over the best feasible step time, minus one).
- ``breakdown.csv``: the top-k feasible plans in long form: (rank, plan, term, seconds).
- ``ops.csv``: one row per op, plus ``share_of_compute`` (its compute_s over the sum).
- ``stages.csv``: one row per pipeline stage, plus ``backward_s`` (micro_batch_time_s -
  forward_s) and ``memory_gib``.
- ``predicted_vs_measured.csv``: one row per run folder: predicted and median measured step
  time, their ratio and error, predicted and measured peak memory.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from autoplan.report.folder import PlanFolder, ReportError
from autoplan.types._check import write_text_atomic
from autoplan.types.cost import Cost
from autoplan.types.run_folder import RunFolder

GIB = 2**30


def plans_table(folder: PlanFolder) -> pd.DataFrame:
    plans = folder.plans.copy()
    for column in ("rank", "peak_memory_bytes"):  # integers with blanks (pruned rows) read back as floats
        plans[column] = pd.to_numeric(plans[column], errors="coerce").round().astype("Int64")
    plans["family"] = (
        "dp=" + plans["dp"].astype(str) + " tp=" + plans["tp"].astype(str) + " pp=" + plans["pp"].astype(str)
    )
    step = pd.to_numeric(plans["step_time_s"], errors="coerce")
    feasible = plans["feasible"].astype(str).str.lower() == "true"
    best = step[feasible].min() if feasible.any() else float("nan")
    plans["slowdown_vs_best"] = step / best - 1.0
    plans["peak_memory_gib"] = pd.to_numeric(plans["peak_memory_bytes"], errors="coerce") / GIB
    return plans


def describe_row(row: pd.Series) -> str:
    """The Plan.describe() string of a plans.csv row."""
    sp = " sp" if str(row["sp"]).lower() == "true" else ""
    v = f" v={row['v']}" if str(row["v"]) not in ("1", "*") else ""
    overlap = " tp-overlap" if str(row.get("tp_overlap", "")).lower() == "true" else ""
    ep = f" ep={row['ep']}" if str(row.get("ep", 1)) not in ("1", "nan") else ""
    return (
        f"dp={row['dp']}{ep} tp={row['tp']} pp={row['pp']} "
        f"mbs={row['mbs']}x{row['num_microbatches']} {row['schedule']}{v} "
        f"zero={row['zero']} rc={row['recompute']}{sp} {row['precision']}{overlap}"
    )


def top_feasible(plans: pd.DataFrame, k: int) -> pd.DataFrame:
    """The ``k`` best feasible plans in the planner's own order (its objective: plans.csv's rank)."""
    feasible = plans[plans["feasible"].astype(str).str.lower() == "true"].copy()
    feasible["step_time_s"] = pd.to_numeric(feasible["step_time_s"])
    return feasible.sort_values(["rank", "step_time_s"], kind="stable").head(k)


def breakdown_table(plans: pd.DataFrame, *, top_k: int) -> pd.DataFrame:
    top = top_feasible(plans, top_k)
    rows = [
        {"rank": i + 1, "plan": describe_row(row), "term": term, "seconds": float(row[term])}
        for i, (_, row) in enumerate(top.iterrows())
        for term in Cost.TIME_FIELDS
    ]
    return pd.DataFrame(rows, columns=["rank", "plan", "term", "seconds"])


def ops_table(folder: PlanFolder) -> pd.DataFrame | None:
    if folder.ops is None:
        return None
    ops = folder.ops.copy()
    total = ops["compute_s"].sum()
    ops["share_of_compute"] = ops["compute_s"] / total if total > 0 else 0.0
    return ops


def stages_table(folder: PlanFolder) -> pd.DataFrame | None:
    if folder.stages is None:
        return None
    stages = folder.stages.copy()
    if "forward_s" in stages:
        stages["backward_s"] = stages["micro_batch_time_s"] - stages["forward_s"]
    stages["memory_gib"] = stages["memory_bytes"] / GIB
    return stages


def runs_table(folder: PlanFolder, runs: list[RunFolder]) -> pd.DataFrame:
    predicted_peak = folder.plan.predicted.peak_memory_bytes if folder.plan and folder.plan.predicted else None
    rows = []
    for run in runs:
        s = run.summary
        predicted, measured = s.predicted_step_time_s, s.median_step_time_s
        if predicted is None or measured is None:
            raise ReportError(
                f"run folder '{run.path}' has no predicted or median step time in summary.json; re-run `autoplan run`."
            )
        rows.append(
            {
                "run": run.path.name,
                "plan": s.plan,
                "steps": s.steps,
                "warmup_steps": s.warmup_steps,
                "predicted_step_time_s": predicted,
                "measured_step_time_s": measured,
                "measured_over_predicted": measured / predicted,
                "error_pct": 100.0 * (predicted - measured) / measured,
                "predicted_peak_memory_bytes": predicted_peak,
                "measured_peak_memory_bytes": s.peak_memory_bytes,
                "peak_memory_kind": s.peak_memory_kind,
                "final_loss": s.final_loss,
            }
        )
    return pd.DataFrame(rows)


def steps_table(runs: list[RunFolder]) -> pd.DataFrame:
    """Every measured step of every run, long form."""
    frames = [run.measured.assign(run=run.path.name) for run in runs]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def audit_table(runs: list[RunFolder]) -> pd.DataFrame | None:
    """Every audited run's rows (autoplan/execute/job/audit.py), with the run's folder name; None
    when no run was audited."""
    frames = [run.audit.assign(run=run.path.name) for run in runs if run.audit is not None]
    return pd.concat(frames, ignore_index=True) if frames else None


def audit_summary(audit: pd.DataFrame) -> pd.DataFrame:
    """Per run and quantity, over ranks: how many rows equal the prediction and the largest error."""
    frame = audit.assign(abs_error=audit.relative_error.abs())
    frame["quantity"] = frame.what.str.replace(r"^comm .*", "collectives", regex=True)
    grouped = frame.groupby(["run", "quantity"], sort=False)
    return grouped.agg(
        rows=("as_priced", "size"), as_priced=("as_priced", "sum"), max_abs_error=("abs_error", "max")
    ).reset_index()


def write_tables(folder: PlanFolder, runs: list[RunFolder], out: Path, *, top_k: int) -> dict[str, Path]:
    """Write every table that has data; return name -> path."""
    plans = plans_table(folder)
    tables = {
        "plans.csv": plans,
        "breakdown.csv": breakdown_table(plans, top_k=top_k),
        "ops.csv": ops_table(folder),
        "stages.csv": stages_table(folder),
    }
    if runs:
        tables["predicted_vs_measured.csv"] = runs_table(folder, runs)
        tables["measured_steps.csv"] = steps_table(runs)
        tables["audit.csv"] = audit_table(runs)
    return {
        name: write_text_atomic(out / name, frame.to_csv(index=False))
        for name, frame in tables.items()
        if frame is not None
    }
