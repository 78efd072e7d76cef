"""``autoplan.report.report(DIR, [RUNDIR...], out=REPORTDIR)``: a plan folder (and its runs) as a report.

REPORTDIR receives the tidy tables (autoplan/report/tables.py), the figures
(autoplan/report/figures.py), ``explain.md`` (autoplan/report/explain.py, when the plan
folder holds graph.json and profile.json), ``report.md`` (autoplan/report/markdown.py) and
``report.html`` (autoplan/report/html.py: the same sections with interactive figures, offline).
"""

from __future__ import annotations

import json
from pathlib import Path

from autoplan.cost import usable_bytes
from autoplan.report import figures as fig
from autoplan.report.folder import load_plan_folder, load_run_folder, search_again
from autoplan.report.html import Drawn, write_html
from autoplan.report.markdown import report_markdown
from autoplan.report.memory import memory_bars
from autoplan.report.tables import audit_table, breakdown_table, plans_table, runs_table, stages_table, write_tables
from autoplan.report.timeline import from_plan_folder
from autoplan.types._check import write_text_atomic


def _drawn(folder, result, *, top_k: int) -> Drawn:
    """What both the PNGs and report.html draw, computed once."""
    plans = plans_table(folder)
    timeline, title = None, ""
    if folder.plan is not None and folder.stages is not None:
        timeline = from_plan_folder(folder)
        plan = folder.plan
        steps = f" as {plan.schedule_steps} schedule steps" if plan.schedule_steps > 1 else ""
        title = f"{plan.describe()}: one step ({plan.schedule}, {plan.num_microbatches} micro-batches{steps})"
    capacity = (
        folder.profile.device.memory_bytes
        if folder.profile
        else (folder.plan.predicted.memory_capacity_bytes if folder.plan and folder.plan.predicted else None)
    )
    return Drawn(
        breakdown=breakdown_table(plans, top_k=top_k),
        timeline=timeline,
        timeline_title=title,
        memory=memory_bars(folder, result, top_k=top_k),
        capacity_bytes=capacity,
        usable_bytes=usable_bytes(capacity) if capacity else None,
    )


def _figures(drawn: Drawn, runs_frame, out: Path) -> dict[str, str]:
    made: dict[str, Path] = {}
    if len(drawn.breakdown):
        made["breakdown.png"] = fig.breakdown_figure(drawn.breakdown, out / "breakdown.png")
    if drawn.timeline is not None:
        made["timeline.png"] = fig.timeline_figure(drawn.timeline, out / "timeline.png", title=drawn.timeline_title)
    if drawn.memory and drawn.capacity_bytes:
        made["memory.png"] = fig.memory_figure(
            drawn.memory, out / "memory.png", capacity_bytes=drawn.capacity_bytes, usable_bytes=drawn.usable_bytes
        )
    if runs_frame is not None and len(runs_frame):
        made["predicted_vs_measured.png"] = fig.predicted_measured_figure(runs_frame, out / "predicted_vs_measured.png")
    return {name: path.name for name, path in made.items()}


def _traces(folder, run_dirs: list[Path], out: Path) -> dict[str, Path]:
    """timeline.json (the predicted trace) and, for traced runs, timeline_diff.csv (trace_diff.py)."""
    if folder.plan is None or folder.graph is None or folder.profile is None:
        return {}
    from autoplan.report.trace_diff import TIMELINE_DIFF_CSV, write_timeline_diff
    from autoplan.report.trace_events import TIMELINE_JSON, predicted_trace

    predicted = predicted_trace(folder)
    made = {TIMELINE_JSON: write_text_atomic(out / TIMELINE_JSON, json.dumps(predicted))}
    if (diff := write_timeline_diff(predicted, run_dirs, out)) is not None:
        made[TIMELINE_DIFF_CSV] = diff
    return made


def report(
    plan_dir: str | Path, run_dirs: list[str | Path] = (), *, out: str | Path, top_k: int = 5, explain: bool = True
) -> dict[str, Path]:
    """Write the report of ``plan_dir`` (and its run folders) to ``out``; return name -> path."""
    from autoplan.report.explain import explain_result

    folder = load_plan_folder(plan_dir)
    runs = [load_run_folder(r) for r in run_dirs]
    out = Path(out)
    paths = write_tables(folder, runs, out, top_k=top_k)
    result, exp, explanation_md = None, None, None
    if folder.plan is not None and folder.graph is not None and folder.profile is not None:
        result = search_again(folder)  # memory.png re-prices the top plans from it
    if explain and result is not None:
        exp = explain_result(
            result, graph=folder.graph, profile=folder.profile, objective=folder.search_options["objective"]
        )
        explanation_md = exp.to_markdown()
        paths["explain.md"] = write_text_atomic(out / "explain.md", explanation_md)
    runs_frame = runs_table(folder, runs) if runs else None
    drawn = _drawn(folder, result, top_k=top_k)
    figures = _figures(drawn, runs_frame, out)
    paths.update({name: out / name for name in figures})
    tables = {
        "plans": plans_table(folder),
        "stages": stages_table(folder),
        "runs": runs_frame,
        "audit": audit_table(runs),
    }
    paths.update(_traces(folder, [Path(r) for r in run_dirs], out))
    text = report_markdown(folder, tables=tables, figures=figures, explanation_md=explanation_md, top_k=top_k)
    paths["report.md"] = write_text_atomic(out / "report.md", text)
    paths.update(write_html(folder, out=out, tables=tables, drawn=drawn, exp=exp, result=result, top_k=top_k))
    return paths
