"""What rank 0 puts in the run folder: the measured steps and summary.json's entries. The files and
their columns are written by the run folder's one writer (autoplan/types/run_folder.py)."""

from __future__ import annotations

import os
import statistics
from dataclasses import replace
from pathlib import Path
from typing import Any, Protocol

import torch

from autoplan.types.run_folder import MEASURED_COLUMNS, MeasuredStep, RunSummary, write_run_folder


class RunPaths(Protocol):
    """The paths of a run the outputs name (the runner's RunOptions has them)."""

    out: str  # the run folder
    model: str  # the model file
    plan: str  # the plan file


def warmup_steps(steps: int) -> int:
    """Steps left out of the median: 1 for short runs, 2 from 6 steps, never all of them."""
    return min(max(steps - 1, 0), 1 if steps < 6 else 2)


def write_outputs(
    *, opts: RunPaths, plan, rows: list[dict[str, Any]], verified: dict | None, nonfinite: dict | None = None
) -> None:
    """``rows``: the timed steps (step, step_time_s, loss, peak_memory_bytes); ``nonfinite``: the step
    whose loss stopped the run (execute/job/nonfinite.py), for summary.json."""
    summary = replace(summarize(plan=plan, rows=rows, verified=verified), **run_inputs(opts=opts, plan=plan))
    if nonfinite is not None:
        summary = replace(summary, nonfinite_loss=nonfinite, final_loss=None)
    steps = [MeasuredStep(**{k: r[k] for k in MEASURED_COLUMNS}) for r in rows]
    write_run_folder(opts.out, steps=steps, summary=summary, plan=plan)


def run_inputs(*, opts: RunPaths, plan) -> dict[str, Any]:
    """What `autoplan calibrate` needs to re-price this run: the model file, the global batch,
    and the AUTOPLAN_* environment the model file may read its sizes from (plan.json is copied beside)."""
    return {
        "model_file": str(Path(opts.model).resolve()),
        "plan_file": str(Path(opts.plan).resolve()),
        "global_batch_size": plan.global_batch_size,
        "environment": {
            k: v for k, v in sorted(os.environ.items()) if k.startswith("AUTOPLAN_") and k != "AUTOPLAN_ERROR_DIR"
        },
    }


def summarize(*, plan, rows: list[dict[str, Any]], verified: dict | None) -> RunSummary:
    """The run summary: median step time after warm-up beside the plan's prediction."""
    skip = warmup_steps(len(rows))
    times = [r["step_time_s"] for r in rows[skip:]]
    median_s = statistics.median(times) if times else None
    predicted_s = plan.predicted.step_time_s if plan.predicted else None
    return RunSummary(
        plan=plan.describe(),
        model=plan.model,
        devices=plan.devices,
        backend="nccl" if torch.cuda.is_available() else "gloo",
        threads_per_process=torch.get_num_threads(),
        steps=len(rows),
        warmup_steps=skip,
        median_step_time_s=median_s,
        predicted_step_time_s=predicted_s,
        measured_over_predicted=(median_s / predicted_s) if median_s and predicted_s else None,
        final_loss=rows[-1]["loss"] if rows else None,
        peak_memory_bytes=max((r["peak_memory_bytes"] for r in rows), default=None),
        peak_memory_kind="cuda_max_allocated" if torch.cuda.is_available() else "cpu_max_rss",
        verify=verified,
    )
