"""Read a plan folder (written by ``autoplan plan``) and a run folder (written by ``autoplan run``).

Plan folder ``DIR`` (docs/plan-format.md): ``plan.json`` (absent when nothing fit),
``plans.csv``, ``ops.csv``, ``stages.csv``, and the planner's inputs ``graph.json`` and
``profile.json``. Run folder ``RUNDIR`` (autoplan/types/run_folder.py, its one reader): ``measured.csv``
and ``summary.json``, and ``audit.csv`` after ``autoplan run --audit``.

:func:`search_again` re-runs the planner's search on the saved graph and profile with the
saved options (``plan.json`` ``predicted.search``: batch_size, fixes, objective), which gives
every candidate back as a priced :class:`~autoplan.types.Plan`; the explanation re-prices
those plans under changed profiles and batches.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from autoplan.errors import AutoplanError, PlanError
from autoplan.types._check import read_json
from autoplan.types.graph import Graph
from autoplan.types.plan import Plan
from autoplan.types.profile import Profile
from autoplan.types.run_folder import MEASURED_CSV, RunFolder
from autoplan.types.tables import read_table


class ReportError(AutoplanError):
    """A plan or run folder is missing a file or has a malformed one."""


@dataclass
class PlanFolder:
    path: Path
    plan: Plan | None
    plans: pd.DataFrame
    ops: pd.DataFrame | None
    stages: pd.DataFrame | None
    graph: Graph | None
    profile: Profile | None

    @property
    def search_options(self) -> dict[str, Any]:
        saved = self.plan.predicted.search if self.plan and self.plan.predicted else None
        if saved is None:
            return {"batch_size": None, "fixes": {}, "objective": "time", "allow_lossy": False, "allow_fp8": False}
        return {
            "batch_size": saved.batch_size,
            "fixes": saved.fixes or {},
            "objective": saved.objective,
            "allow_lossy": saved.allow_lossy,
            "allow_fp8": saved.allow_fp8 or self.plan.precision == "fp8",  # plans of before searched fp8 unasked
        }


def _csv(path: Path, *, required: bool) -> pd.DataFrame | None:
    table = read_table(path, error=ReportError, rerun="autoplan plan")
    if table is None and required:
        raise ReportError(f"'{path}' does not exist; pass a folder written by `autoplan plan --out DIR`.")
    return table


def load_plan_folder(path: str | Path) -> PlanFolder:
    """Load every file of a plan folder; only plans.csv is required."""
    folder = Path(path)
    if not folder.is_dir():
        raise ReportError(f"plan folder '{folder}' does not exist; pass the --out DIR of `autoplan plan`.")
    plan = Plan.load(folder / "plan.json") if (folder / "plan.json").is_file() else None
    graph = Graph.load(folder / "graph.json") if (folder / "graph.json").is_file() else None
    profile = None
    if (folder / "profile.json").is_file():
        profile = Profile.from_dict(read_json(folder / "profile.json", ReportError, "profile"))
    return PlanFolder(
        path=folder,
        plan=plan,
        plans=_csv(folder / "plans.csv", required=True),
        ops=_csv(folder / "ops.csv", required=False),
        stages=_csv(folder / "stages.csv", required=False),
        graph=graph,
        profile=profile,
    )


def load_run_folder(path: str | Path) -> RunFolder:
    """A run folder with its measured steps (the report plots them)."""
    run = RunFolder.read(path, error=ReportError)
    if run.measured is None:
        raise ReportError(
            f"'{run.path / MEASURED_CSV}' does not exist; pass a folder written by `autoplan run --out RUNDIR`."
        )
    return run


def search_again(folder: PlanFolder):
    """The planner's SearchResult for this folder, re-computed from graph.json and profile.json."""
    from autoplan.solve.api import plan_graph

    if folder.plan is None:
        raise ReportError(
            f"no plan fit in '{folder.path}', so there is no decision to explain; {most_frugal(folder.plans)}"
        )
    if folder.graph is None or folder.profile is None:
        missing = "graph.json" if folder.graph is None else "profile.json"
        raise ReportError(
            f"plan folder '{folder.path}' has no {missing}; re-run `autoplan plan ... --out {folder.path}` "
            "with this version of autoplan to explain it."
        )
    options = folder.search_options
    try:
        return plan_graph(
            folder.graph,
            devices=folder.plan.devices,
            profile=folder.profile,
            batch_size=options["batch_size"] or folder.plan.global_batch_size,
            fix=dict(options["fixes"]),
            objective=options["objective"],
            allow_lossy=options["allow_lossy"],
            allow_fp8=options["allow_fp8"],
            runtime=folder.plan.runtime,  # the runtime it was planned for
        )
    except PlanError as exc:
        raise ReportError(f"re-running the search of '{folder.path}' failed ({exc}); re-run `autoplan plan`.") from None


def _ep(row) -> str:
    ep = str(row.get("ep", 1))
    return f" ep={ep}" if ep not in ("1", "nan") else ""


def most_frugal(plans: pd.DataFrame) -> str:
    """One sentence on the candidate that came closest to fitting (plans.csv's smallest peak)."""
    peaks = pd.to_numeric(plans["peak_memory_bytes"], errors="coerce")
    if peaks.notna().any():
        row = plans.loc[peaks.idxmin()]
        return (
            f"the most frugal candidate (dp={row['dp']}{_ep(row)} tp={row['tp']} pp={row['pp']} zero={row['zero']} "
            f"recompute={row['recompute']}) {row['reason']}; see plans.csv."
        )
    return "see plans.csv's reason column."
