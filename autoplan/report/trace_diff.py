"""The measured step beside the predicted one (docs/report.md, "The measured trace"): ``autoplan run --trace``'s
traces (RUNDIR/traces/rank{r}_step{s}.json, execute/job/tracing.py) aligned with the plan's predicted trace
(trace_events.py) by pipeline stage and event name, written as ``timeline_diff.csv``.

Rows, per stage K (a trace's pid):
- a chunk, "F mb3 c0" / "B mb3 c0" / "W mb3 c0": predicted = its event's duration on the predicted compute
  thread; measured = the median, over the stage's ranks and traced steps, of the events of that name;
- a communication thread, "dp", "tp", "pp", "ep", "cp": the sum of its events in one step (exposed and
  hidden alike), predicted and measured (median over the stage's traces);
- "step": the predicted step time and the measured traced step.
Columns: diff_ms = 1000 (measured - predicted), ratio = measured / predicted; the rows sorted by diff_ms,
largest first: what took longer than priced, and by how much. An event only one side has is listed with
the other side empty.
"""

from __future__ import annotations

import json
from pathlib import Path
from statistics import median

import pandas as pd

from autoplan.report.folder import ReportError
from autoplan.types.trace_names import CHUNK_NAME, COMM_THREADS, THREADS, TRACES_DIR, US_PER_S

TIMELINE_DIFF_CSV = "timeline_diff.csv"
COLUMNS = ("stage", "event", "what", "predicted_s", "measured_s", "diff_ms", "ratio", "measured_traces")


def measured_traces(run_dir: str | Path) -> list[dict]:
    """Every trace ``autoplan run --trace`` wrote in ``run_dir`` (none when it ran without --trace)."""
    traces = []
    for path in sorted(Path(run_dir, TRACES_DIR).glob("rank*_step*.json")):
        try:
            traces.append(json.loads(path.read_text()))
        except (OSError, ValueError) as exc:
            raise ReportError(f"'{path}' is not a trace autoplan run --trace wrote ({exc}); re-run it.") from None
    return traces


def step_totals(trace: dict) -> dict[tuple[int, str, str], float]:
    """(stage, event, what) -> seconds in one trace: each chunk's, each comm thread's sum, and the step."""
    totals: dict[tuple[int, str, str], float] = {}
    for e in trace["traceEvents"]:
        if e.get("ph") != "X":
            continue
        tid, seconds = e["tid"], e["dur"] / US_PER_S
        if tid == 0 and CHUNK_NAME.match(e["name"]):
            key = (e["pid"], e["name"], "chunk")
        elif 0 < tid < len(THREADS) and THREADS[tid] in COMM_THREADS:
            key = (e["pid"], THREADS[tid], "communication")
        else:
            continue
        totals[key] = totals.get(key, 0.0) + seconds
    return totals


def _predicted_steps(trace: dict) -> dict[tuple[int, str, str], float]:
    step = trace["otherData"].get("step_time_s")
    stages = {e["pid"] for e in trace["traceEvents"] if e.get("ph") == "X"}
    return {(k, "step", "step"): step for k in stages} if step is not None else {}


def timeline_diff(predicted: dict, measured: list[dict]) -> pd.DataFrame:
    """The rows of timeline_diff.csv (module docstring) of one predicted trace against measured ones."""
    expected = {**step_totals(predicted), **_predicted_steps(predicted)}
    seen: dict[tuple[int, str, str], list[float]] = {}
    for trace in measured:
        totals = step_totals(trace)
        stage = trace["otherData"]["stage"]
        totals[(stage, "step", "step")] = trace["otherData"]["step_time_s"]
        for key, seconds in totals.items():
            seen.setdefault(key, []).append(seconds)
    rows = []
    for key in sorted(set(expected) | set(seen)):
        want, got = expected.get(key), median(seen[key]) if key in seen else None
        both = want is not None and got is not None
        rows.append(
            {
                "stage": key[0],
                "event": key[1],
                "what": key[2],
                "predicted_s": want,
                "measured_s": got,
                "diff_ms": 1e3 * (got - want) if both else None,
                "ratio": got / want if both and want > 0 else None,
                "measured_traces": len(seen.get(key, [])),
            }
        )
    frame = pd.DataFrame(rows, columns=list(COLUMNS))
    return frame.sort_values("diff_ms", ascending=False, na_position="last", kind="stable").reset_index(drop=True)


def write_timeline_diff(predicted: dict, run_dirs: list[Path], out: Path) -> Path | None:
    """timeline_diff.csv in ``out`` from every traced run folder; None when no run was traced."""
    measured = [t for run in run_dirs for t in measured_traces(run)]
    if not measured:
        return None
    path = out / TIMELINE_DIFF_CSV
    timeline_diff(predicted, measured).to_csv(path, index=False)
    return path
