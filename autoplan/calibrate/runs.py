"""Measured runs as calibration data: one run folder -> (traced graph, plan, measured step time).

A run folder is what ``autoplan run ... --out RUNDIR`` writes (docs/executor.md), read by its one
reader (autoplan/types/run_folder.py): ``summary.json`` (``median_step_time_s``; ``model_file``,
``global_batch_size`` and the ``AUTOPLAN_*`` ``environment`` the model file may read its sizes from)
and a copy of the ``plan.json`` it ran. The model is re-traced at the run's global batch under that environment,
once per distinct (model file, batch, environment). Every way a folder cannot be used raises
:class:`CalibrationError` with one sentence.
"""

from __future__ import annotations

import math
import os
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from autoplan.errors import AutoplanError, PlanError
from autoplan.jobs.environ import environment
from autoplan.types.graph import Graph
from autoplan.types.plan import Plan
from autoplan.types.profile import Profile
from autoplan.types.run_folder import RunFolder


class CalibrationError(AutoplanError):
    """A run folder or profile cannot be used for calibration."""


@dataclass
class Observation:
    """One measured run: what the cost model prices (graph, plan) and what was measured."""

    graph: Graph
    plan: Plan
    measured_step_time_s: float
    label: str = ""  # the run folder, or any name
    model_file: str = ""
    environment: dict[str, str] = field(default_factory=dict)
    noise_sigma: float | None = None  # log std of the measured median, from the run's own step times (None: unknown)


@dataclass(frozen=True)
class CalibrationRun:
    """A run folder's facts that calibration uses, checked (:func:`read_run_folder`)."""

    folder: Path
    plan: Plan
    measured_step_time_s: float
    model_file: str
    global_batch_size: int
    environment: tuple[tuple[str, str], ...]
    backend: str | None
    noise_sigma: float | None = None


def read_run_folder(folder: str | os.PathLike) -> CalibrationRun:
    """Read and check one run folder (module docstring)."""
    run = RunFolder.read(folder, error=CalibrationError)
    folder, summary = run.path, run.summary
    plan = _plan(run)
    measured = summary.median_step_time_s
    if not isinstance(measured, (int, float)) or measured <= 0:
        raise CalibrationError(
            f"run folder '{folder}' has no positive median_step_time_s in summary.json; rerun it with more --steps."
        )
    model_file = summary.model_file
    if not model_file or not Path(model_file).is_file():
        raise CalibrationError(
            f"run folder '{folder}' does not record an existing model_file in summary.json ({model_file!r}); "
            "rerun it with this autoplan's `autoplan run`, which records it."
        )
    batch = int(summary.global_batch_size or plan.global_batch_size)
    env = tuple(sorted(summary.environment.items()))
    times = run.step_times_s()
    return CalibrationRun(
        folder=folder,
        plan=plan,
        measured_step_time_s=float(measured),
        model_file=str(model_file),
        global_batch_size=batch,
        environment=env,
        backend=summary.backend,
        noise_sigma=None if times is None else median_noise_sigma(times, skip=summary.warmup_steps or 0),
    )


def median_noise_sigma(step_times_s: list[float], *, skip: int) -> float | None:
    """Log standard deviation of a median of k step times: 1.2533 * sigma / sqrt(k) (the median's asymptotic
    efficiency), sigma = IQR(ln t) / 1.349 (a normal's IQR), over the steps after the first ``skip``;
    None with < 4 timed steps."""
    times = step_times_s[skip:]
    if len(times) < 4 or min(times) <= 0:
        return None
    q1, _, q3 = statistics.quantiles([math.log(t) for t in times], n=4)
    return 1.2533 * (q3 - q1) / 1.349 / math.sqrt(len(times))


def _plan(run: RunFolder) -> Plan:
    path = run.plan_path()
    if path is None:
        raise CalibrationError(
            f"run folder '{run.path}' has no plan.json and its recorded plan_file is gone; "
            "rerun it with `autoplan run`."
        )
    try:
        return Plan.load(path)
    except PlanError as exc:
        raise CalibrationError(f"run folder '{run.path}': {exc}") from None


def check_matches(run: CalibrationRun, profile: Profile) -> None:
    """A run belongs to ``profile`` when its plan was made for it and it ran on the profile's backend."""
    if run.plan.profile and run.plan.profile != profile.name:
        raise CalibrationError(
            f"run folder '{run.folder}' ran a plan made for profile '{run.plan.profile}', not '{profile.name}'; "
            "calibrate each profile from its own runs."
        )
    if run.backend and run.backend != profile.backend:
        raise CalibrationError(
            f"run folder '{run.folder}' ran on {run.backend} but profile '{profile.name}' describes {profile.backend}; "
            "calibrate each profile from its own runs."
        )
    if run.plan.devices > profile.devices_per_node and profile.inter_node is None:
        raise CalibrationError(
            f"run folder '{run.folder}' used {run.plan.devices} devices "
            f"but profile '{profile.name}' describes one node of {profile.devices_per_node}; "
            "calibrate a profile with an inter_node link."
        )


def load_observations(folders: list[str | os.PathLike], *, profile: Profile) -> list[Observation]:
    """Read every run folder, check it against ``profile``, and trace each distinct model once."""
    from autoplan.trace import trace_model_file

    if not folders:
        raise CalibrationError(
            "no run folders given; pass one or more folders written by `autoplan run ... --out RUNDIR`."
        )
    runs = [read_run_folder(f) for f in folders]
    for run in runs:
        check_matches(run, profile)
    graphs: dict[tuple, Graph] = {}
    out = []
    for run in runs:
        key = (run.model_file, run.global_batch_size, run.environment)
        if key not in graphs:
            with environment(run.environment):
                graphs[key] = trace_model_file(run.model_file, run.global_batch_size)
        out.append(
            Observation(
                graph=graphs[key],
                plan=run.plan,
                measured_step_time_s=run.measured_step_time_s,
                label=str(run.folder),
                model_file=run.model_file,
                environment=dict(run.environment),
                noise_sigma=run.noise_sigma,
            )
        )
    return out
