"""``report.html``: the report as one page that opens in a browser, offline (docs/report.md, "report.html").

Jinja2 lays out ``templates/report.html.j2`` (package data). Each section's words and tables are the
Markdown that report.md and explain.md hold (autoplan/report/markdown.py, narrate.py), turned into HTML
by markdown-it-py with raw HTML off, so the page and report.md never disagree and no text can inject
markup; the figures are plotly divs (autoplan/report/interactive.py) that the page's one inlined copy
of plotly.js draws. Sections: the plan, the ranking of alternatives, the timeline (the simulated step,
and the plan folder's ``timeline.json`` copied beside the page for Perfetto when there is one), memory
per stage, sensitivity, the what-if trades, predicted against measured, checkpoints.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
from jinja2 import Environment, PackageLoader, select_autoescape
from markdown_it import MarkdownIt
from markupsafe import Markup

from autoplan.cost import CostModel
from autoplan.report import interactive as plot
from autoplan.report.folder import PlanFolder, ReportError
from autoplan.report.markdown import AUDIT_COLUMNS, RUN_COLUMNS, STAGE_COLUMNS, frame_table, model_lines, plan_lines
from autoplan.report.markdown import top_table as top_plans_table
from autoplan.report.memory import MemoryBar, stage_bars
from autoplan.report.narrate import explanation_sections
from autoplan.report.tables import audit_summary, top_feasible
from autoplan.report.timeline import Timeline
from autoplan.types._check import write_text_atomic
from autoplan.types.tables import read_table

#: the predicted trace of `autoplan plan` (Chrome trace format) and the measured-against-predicted table
TRACE, TRACE_DIFF = "timeline.json", "timeline_diff.csv"


@dataclass
class Drawn:
    """What report.md's PNGs and report.html's figures both draw (autoplan/report/api.py computes it once)."""

    breakdown: pd.DataFrame
    timeline: Timeline | None
    timeline_title: str
    memory: list[MemoryBar]
    capacity_bytes: float | None
    usable_bytes: float | None


def markdown_html(lines: list[str]) -> Markup:
    """Markdown lines as HTML, their own '## ' headings left to the template's sections."""
    text = "\n".join(line for line in lines if not line.startswith("## "))
    return Markup(MarkdownIt("commonmark", {"html": False}).enable("table").render(text))


def _figures(
    folder: PlanFolder, drawn: Drawn, result, runs: pd.DataFrame | None, trace: dict | None
) -> dict[str, Markup]:
    figures = {}
    if len(drawn.breakdown):
        figures["breakdown"] = plot.breakdown(drawn.breakdown)
    title = "the predicted trace (timeline.json), as Perfetto lays it"
    if trace is not None and (fig := plot.trace(trace, title=title)) is not None:
        figures["trace"] = fig  # drawn from the priced terms: it ends at the predicted step on every stage
    elif drawn.timeline is not None:  # the schedule simulated from stages.csv (timeline.png), when there is no trace
        figures["timeline"] = plot.timeline(drawn.timeline, title=drawn.timeline_title)
    if drawn.memory and drawn.usable_bytes:
        figures["memory"] = plot.memory(
            drawn.memory,
            title="the top plans (the ranks of the ranking's table): the most loaded device at its peak",
            usable_bytes=drawn.usable_bytes,
            capacity_bytes=drawn.capacity_bytes,
            numbered=True,
        )
    if result is not None and result.best is not None and drawn.usable_bytes:
        bars = stage_bars(CostModel(folder.graph, folder.profile), result.best)
        figures["stage_memory"] = plot.memory(
            bars,
            title=f"the chosen plan: each stage at its peak ({result.best.describe()})",
            usable_bytes=drawn.usable_bytes,
            capacity_bytes=drawn.capacity_bytes,
        )
    if runs is not None and len(runs):
        figures["predicted_vs_measured"] = plot.predicted_vs_measured(runs)
    return {name: Markup(plot.as_div(fig, f"figure-{name}")) for name, fig in figures.items()}


def _tables(folder: PlanFolder, tables: dict, out: Path, *, top_k: int) -> dict[str, Markup]:
    html = {"intro": markdown_html(model_lines(folder)), "plan": markdown_html(plan_lines(folder))}
    if len(top_feasible(tables["plans"], top_k)):
        html["top"] = markdown_html(top_plans_table(tables["plans"], top_k))
    if tables.get("stages") is not None:
        html["stages"] = markdown_html(frame_table(tables["stages"], STAGE_COLUMNS))
    if tables.get("runs") is not None:
        html["runs"] = markdown_html(frame_table(tables["runs"], RUN_COLUMNS))
    if tables.get("audit") is not None:
        html["audit"] = markdown_html(frame_table(audit_summary(tables["audit"]), AUDIT_COLUMNS))
    diff = read_table(out / TRACE_DIFF, error=ReportError, rerun="autoplan report")
    if diff is not None:
        html["timeline_diff"] = markdown_html(frame_table(diff, list(diff.columns)))
    return html


def _copy_trace(folder: PlanFolder, out: Path) -> dict[str, Path]:
    """The predicted trace beside the page, so its link and Perfetto find it there: the one report/api.py
    wrote from the plan folder's terms, else the plan folder's own timeline.json."""
    source, copy = folder.path / TRACE, out / TRACE
    if copy.is_file():
        return {TRACE: copy}
    if not source.is_file():
        return {}
    if source.resolve() != copy.resolve():
        write_text_atomic(copy, source.read_text())
    return {TRACE: copy}


def render_html(**context) -> str:
    """``templates/report.html.j2`` filled with ``context`` (autoescaped; Markup passes as HTML)."""
    env = Environment(loader=PackageLoader("autoplan.report", "templates"), autoescape=select_autoescape(["j2"]))
    return env.get_template("report.html.j2").render(plotly_js=Markup(plot.plotly_js()), **context)


def write_html(
    folder: PlanFolder, *, out: Path, tables: dict, drawn: Drawn, exp, result, top_k: int
) -> dict[str, Path]:
    """Write ``out/report.html`` (and the trace it links); return name -> path."""
    written = _copy_trace(folder, out)
    trace = json.loads(written[TRACE].read_text()) if TRACE in written else None
    sections = explanation_sections(exp) if exp is not None else {}
    page = render_html(
        title=folder.path.name,
        top_k=top_k,
        tables=_tables(folder, tables, out, top_k=top_k),
        figures=_figures(folder, drawn, result, tables.get("runs"), trace),
        trace_events=len(plot.trace_rows(trace)[1]) if trace else 0,
        max_trace_events=plot.MAX_TRACE_EVENTS,
        explanation={name: markdown_html(lines) for name, lines in sections.items()},
        trace=TRACE if written else None,
        plan_folder=str(folder.path),
    )
    written["report.html"] = write_text_atomic(out / "report.html", page)
    return written
