"""The run folder: what ``autoplan run --out RUNDIR`` writes and ``report`` and ``calibrate`` read.

Files (docs/executor.md):

- ``measured.csv``: one row per training step (:data:`MEASURED_COLUMNS`), counted from 0;
- ``summary.json``: the median step time after warm-up beside the plan's prediction, the verify verdict,
  and what re-pricing the run needs (``model_file``, ``plan_file``, ``global_batch_size``, ``environment``);
- ``plan.json``: a copy of the plan that ran;
- ``audit.csv``: after ``autoplan run --audit``, the cost model's prediction beside each rank's measurement.

:func:`write_run_folder` is the executor's one writer (rank 0, each file atomically); :meth:`RunFolder.read`
is the one reader, raising the reading stage's error with one sentence.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autoplan.types._check import write_json_atomic, write_text_atomic
from autoplan.types.tables import csv_text, read_table

if TYPE_CHECKING:
    import pandas as pd

    from autoplan.types.plan import Plan

MEASURED_CSV, SUMMARY_JSON, PLAN_JSON, AUDIT_CSV = "measured.csv", "summary.json", "plan.json", "audit.csv"
MEASURED_COLUMNS = ("step", "step_time_s", "loss", "peak_memory_bytes")
#: audit.csv: per rank and audited quantity, the measured and predicted count and size, and whether they agree
AUDIT_COLUMNS = (
    "rank",
    "stage",
    "what",
    "measured_count",
    "predicted_count",
    "measured",
    "predicted",
    "unit",
    "relative_error",
    "as_priced",
)


@dataclass(frozen=True)
class MeasuredStep:
    """One row of measured.csv: a step's wall time, its loss (all-reduced) and this rank's peak memory."""

    step: int
    step_time_s: float
    loss: float
    peak_memory_bytes: int


def measured_csv(steps: list[MeasuredStep]) -> str:
    """measured.csv's text: times and losses to the microsecond and the sixth decimal."""
    lines = [",".join(MEASURED_COLUMNS)]
    lines += [f"{s.step},{s.step_time_s:.6f},{s.loss:.6f},{s.peak_memory_bytes}" for s in steps]
    return "\n".join(lines) + "\n"


@dataclass
class RunSummary:
    """summary.json. A field a run folder of an older autoplan lacks reads as None; a key this one does
    not know is left unread. ``nonfinite_loss`` (the step whose loss stopped the run) is written only
    when there is one."""

    plan: str | None = None  # Plan.describe()
    model: str | None = None
    devices: int | None = None
    backend: str | None = None  # nccl or gloo
    threads_per_process: int | None = None
    steps: int | None = None
    warmup_steps: int | None = None  # left out of the median
    median_step_time_s: float | None = None
    predicted_step_time_s: float | None = None
    measured_over_predicted: float | None = None
    final_loss: float | None = None
    peak_memory_bytes: int | None = None
    peak_memory_kind: str | None = None  # cuda_max_allocated or cpu_max_rss
    verify: dict[str, Any] | None = None  # --verify's verdict
    model_file: str | None = None  # what calibrate re-traces, at global_batch_size under environment
    plan_file: str | None = None
    global_batch_size: int | None = None
    environment: dict[str, str] = field(default_factory=dict)  # the AUTOPLAN_* variables of the run
    nonfinite_loss: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        if self.nonfinite_loss is None:
            del data["nonfinite_loss"]
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunSummary:
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        values["environment"] = values.get("environment") or {}
        return cls(**values)


def write_run_folder(out: str | Path, *, steps: list[MeasuredStep], summary: RunSummary, plan: Plan) -> None:
    """Write measured.csv, summary.json and the plan's copy into ``out``, each atomically."""
    out = Path(out)
    write_text_atomic(out / MEASURED_CSV, measured_csv(steps))
    write_json_atomic(out / SUMMARY_JSON, summary.to_dict())
    plan.save(out / PLAN_JSON)


def write_audit(out: str | Path, rows: list[dict[str, Any]]) -> None:
    """Write audit.csv into ``out`` atomically: one line per row under :data:`AUDIT_COLUMNS` ('' for None)."""
    text = csv_text(AUDIT_COLUMNS, [[row[name] for name in AUDIT_COLUMNS] for row in rows])
    write_text_atomic(Path(out) / AUDIT_CSV, text)


@dataclass
class RunFolder:
    """A run folder as read back: its summary, and its measured steps and audit when present."""

    path: Path
    summary: RunSummary
    measured: pd.DataFrame | None  # None: no measured.csv
    audit: pd.DataFrame | None = None  # None: not audited

    @classmethod
    def read(cls, path: str | Path, *, error: type[Exception]) -> RunFolder:
        """Read ``path``; a missing folder or summary.json, or a malformed file, raises ``error``."""
        folder = Path(path)
        if not folder.is_dir():
            raise error(
                f"run folder '{folder}' does not exist; pass a folder written by `autoplan run ... --out RUNDIR`."
            )
        return cls(
            path=folder,
            summary=_summary(folder, error),
            measured=read_table(folder / MEASURED_CSV, error=error, rerun="autoplan run"),
            audit=read_table(folder / AUDIT_CSV, error=error, rerun="autoplan run --audit"),
        )

    def step_times_s(self) -> list[float] | None:
        """Every step's measured time in order; None without a readable step_time_s column."""
        if self.measured is None or "step_time_s" not in self.measured:
            return None
        try:
            times = [float(t) for t in self.measured["step_time_s"]]
        except ValueError:
            return None
        return times if all(math.isfinite(t) for t in times) else None

    def plan_path(self) -> Path | None:
        """The plan that ran: the folder's copy, else the plan file summary.json names; None when both are gone."""
        recorded = [Path(self.summary.plan_file)] if self.summary.plan_file else []
        return next((p for p in [self.path / PLAN_JSON, *recorded] if p.is_file()), None)


def _summary(folder: Path, error: type[Exception]) -> RunSummary:
    path = folder / SUMMARY_JSON
    if not path.is_file():
        raise error(
            f"run folder '{folder}' has no summary.json; the run did not finish, "
            f"rerun `autoplan run ... --out {folder}`."
        )
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise error(f"'{path}' is not valid JSON ({exc.msg} at line {exc.lineno}); rerun the run.") from None
    if not isinstance(data, dict):
        raise error(f"'{path}' is not a JSON object; rerun the run.")
    return RunSummary.from_dict(data)
