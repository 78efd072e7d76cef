"""report.html's figures: plotly, drawn from the same data as the PNGs of autoplan/report/figures.py
(its colours and legend words), each a ``<div>`` that the page's one inlined copy of plotly.js draws,
so the page needs no server and no network (docs/report.md, "report.html").

- ``timeline``: one row per pipeline stage, one bar per segment of the simulated step
  (autoplan/report/timeline.py); hovering shows the micro-batch, chunk, start and length.
- ``trace``: the predicted trace (timeline.json, report/trace_events.py) as it lies in Perfetto: one row per
  stage and stream (compute, dp, tp, pp, ep, cp), one bar per event, coloured by its category (forward,
  backward, weight, bubble, exposed or hidden collective, tail); at most :data:`MAX_TRACE_EVENTS` events.
- ``breakdown``: the top plans' step-time terms (breakdown.csv), stacked; they sum to each step time.
- ``memory``: the top plans' priced peaks, and ``stage_memory``: the chosen plan's stages each at its
  own peak (autoplan/report/memory.py), stacked from the parts alive then, against the usable limit.
- ``predicted_vs_measured``: per run, predicted beside median measured step time.
"""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
from plotly.offline import get_plotlyjs

from autoplan.display import TERM_NAMES, duration_unit
from autoplan.report.figures import COLORS, KIND_LABELS, MEMORY_COLORS, TERM_COLORS
from autoplan.report.memory import MemoryBar
from autoplan.report.timeline import Timeline
from autoplan.types.cost import Cost

GIB = 2**30
#: plotly's own buttons less its logo link (the page works offline; nothing on it points away unasked)
CONFIG = {"displaylogo": False, "responsive": True}
#: the most trace events drawn in the page (more would make it slow to open: Perfetto takes the file)
MAX_TRACE_EVENTS = 5000
#: the predicted trace's event categories (report/trace_events.py) and their colours
TRACE_COLORS = {
    "forward": COLORS["forward"],
    "backward": COLORS["backward"],
    "weight": COLORS["weight"],
    "bubble": "#dddddd",
    "exposed": "#c44e52",
    "hidden": "#8fbc8f",
    "tail": "#8172b3",
}
#: a memory limit above this multiple of the tallest bar is stated in the title, not drawn (it would flatten the bars)
OFF_CHART = 3.0


def plotly_js() -> str:
    """plotly.js itself, inlined once in the page's head (no CDN)."""
    return get_plotlyjs()


def as_div(fig: go.Figure, div_id: str) -> str:
    """``fig`` as a ``<div>`` and the script that draws it with the page's plotly.js."""
    fig.update_layout(template="plotly_white", margin={"l": 60, "r": 20, "t": 50, "b": 40}, font={"size": 12})
    return fig.to_html(full_html=False, include_plotlyjs=False, div_id=div_id, config=CONFIG)


def timeline(timeline_: Timeline, *, title: str) -> go.Figure:
    per_unit_s, unit = duration_unit(timeline_.makespan_s)
    rows = [f"stage {k}" for k in range(timeline_.pp)]
    fig = go.Figure()
    for kind, color in COLORS.items():
        segments = [s for s in timeline_.segments if s.kind == kind]
        if not segments:
            continue
        fig.add_bar(
            orientation="h",
            name=KIND_LABELS[kind],
            y=[rows[s.stage] for s in segments],
            base=[s.start_s / per_unit_s for s in segments],
            x=[(s.end_s - s.start_s) / per_unit_s for s in segments],
            marker={"color": color, "line": {"color": "white", "width": 0.5}},
            text=[str(s.microbatch) if s.microbatch >= 0 else "" for s in segments],
            textposition="inside",
            insidetextanchor="middle",
            customdata=[[s.microbatch, s.chunk] for s in segments],
            hovertemplate=f"{kind} micro-batch %{{customdata[0]}} chunk %{{customdata[1]}}<br>"
            f"start %{{base:.4g}} {unit}, length %{{x:.4g}} {unit}<extra></extra>",
        )
    fig.update_layout(
        barmode="overlay",
        title={"text": title + (f"<br><sub>{timeline_.note}</sub>" if timeline_.note else ""), "font": {"size": 13}},
        height=160 + 45 * timeline_.pp,
        legend={"orientation": "h", "y": -0.25},
        xaxis_title=f"time ({unit})",
        yaxis={"categoryorder": "array", "categoryarray": rows[::-1]},
    )
    return fig


def trace_rows(trace: dict) -> tuple[list[str], list[dict]]:
    """The rows ("stage K · thread", in the trace's order) and the complete events of a Chrome trace, each with
    its row: the names come from the trace's metadata events (process_name, thread_name)."""
    processes, threads = {}, {}
    for e in trace["traceEvents"]:
        if e.get("ph") == "M" and e.get("name") == "process_name":
            processes[e["pid"]] = e["args"]["name"]
        elif e.get("ph") == "M" and e.get("name") == "thread_name":
            threads[(e["pid"], e["tid"])] = e["args"]["name"]
    events = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
    keys = sorted({(e["pid"], e["tid"]) for e in events})
    row = {key: f"{processes.get(key[0], key[0])} · {threads.get(key, key[1])}" for key in keys}
    return [row[key] for key in keys], [dict(e, row=row[(e["pid"], e["tid"])]) for e in events]


def trace(trace_: dict, *, title: str) -> go.Figure | None:
    """The predicted trace as bars (module docstring); None past :data:`MAX_TRACE_EVENTS` events."""
    rows, events = trace_rows(trace_)
    if not events or len(events) > MAX_TRACE_EVENTS:
        return None
    per_unit_s, unit = duration_unit(max(e["ts"] + e["dur"] for e in events) / 1e6)
    scale = 1e6 * per_unit_s  # trace microseconds per display unit
    fig = go.Figure()
    for category in dict.fromkeys(e.get("cat", "") for e in events):
        mine = [e for e in events if e.get("cat", "") == category]
        fig.add_bar(
            orientation="h",
            name=category or "other",
            y=[e["row"] for e in mine],
            base=[e["ts"] / scale for e in mine],
            x=[e["dur"] / scale for e in mine],
            marker={"color": TRACE_COLORS.get(category, "#999999"), "line": {"color": "white", "width": 0.5}},
            customdata=[[e["name"]] for e in mine],
            hovertemplate=f"%{{customdata[0]}}<br>start %{{base:.4g}} {unit}, length %{{x:.4g}} {unit}<extra></extra>",
        )
    fig.update_layout(
        barmode="overlay",
        title={"text": title, "font": {"size": 13}},
        height=160 + 28 * len(rows),
        legend={"orientation": "h", "y": -0.25},
        xaxis_title=f"time ({unit})",
        yaxis={"categoryorder": "array", "categoryarray": rows[::-1]},
    )
    return fig


def breakdown(frame: pd.DataFrame) -> go.Figure:
    """``frame``: breakdown.csv's long table (rank, plan, term, seconds)."""
    wide = frame.pivot_table(index=["rank", "plan"], columns="term", values="seconds", aggfunc="sum").reset_index()
    terms = [t for t in Cost.TIME_FIELDS if t in wide]
    per_unit_s, unit = duration_unit(float(wide[terms].sum(axis=1).max()) if len(wide) else 1.0)
    labels = [f"#{r}" for r in wide["rank"]]
    fig = go.Figure()
    for term, color in zip(Cost.TIME_FIELDS, TERM_COLORS):
        if term in wide:
            fig.add_bar(
                name=TERM_NAMES[term].words,
                x=labels,
                y=wide[term] / per_unit_s,
                marker_color=color,
                customdata=wide["plan"],
                hovertemplate=f"%{{customdata}}<br>{TERM_NAMES[term].words}: %{{y:.4g}} {unit}<extra></extra>",
            )
    fig.update_layout(
        barmode="stack",
        title="step-time breakdown of the top plans (the ranks of the table above)",
        yaxis_title=f"step time ({unit})",
        height=480,
        legend={"font": {"size": 10}},
    )
    return fig


def memory(
    bars: list[MemoryBar], *, title: str, usable_bytes: float, capacity_bytes: float | None, numbered: bool = False
) -> go.Figure:
    """``bars`` stacked from their parts (each stack sums to its peak, written above it); ``numbered``:
    labelled #1, #2, ... (the ranks of the top plans' table), each bar's own label on hover."""
    names = list(dict.fromkeys(name for bar in bars for name in bar.parts_bytes))
    labels = [f"#{i}" for i in range(1, len(bars) + 1)] if numbered else [bar.label for bar in bars]
    fig = go.Figure()
    for name, color in zip(names, MEMORY_COLORS * 2):
        fig.add_bar(
            name=name,
            x=labels,
            y=[bar.parts_bytes.get(name, 0.0) / GIB for bar in bars],
            marker_color=color,
            customdata=[bar.label for bar in bars],
            hovertemplate=f"%{{customdata}}<br>{name}: %{{y:.4g}} GiB<extra></extra>",
        )
    fig.add_scatter(
        x=labels,
        y=[bar.peak_bytes / GIB for bar in bars],
        mode="text",
        text=[f"{bar.peak_bytes / GIB:.2f} GiB, {100 * bar.peak_bytes / usable_bytes:.0f}% of usable" for bar in bars],
        textposition="top center",
        showlegend=False,
        hoverinfo="skip",
    )
    limits = [("usable", usable_bytes, "dash")] + ([("capacity", capacity_bytes, "solid")] if capacity_bytes else [])
    top_bytes = max((bar.peak_bytes for bar in bars), default=0.0)
    for name, limit, dash in limits:
        if limit <= OFF_CHART * top_bytes:
            fig.add_hline(y=limit / GIB, line={"dash": dash, "color": "black", "width": 1}, annotation_text=name)
    far = ", ".join(f"{name} {limit / GIB:.1f} GiB" for name, limit, _ in limits)
    fig.update_layout(
        barmode="stack",
        title=f"{title}<br><sub>per device: {far}</sub>",
        yaxis={"title": "GiB per device at its peak", "rangemode": "tozero"},
        height=440,
    )
    return fig


def predicted_vs_measured(runs: pd.DataFrame) -> go.Figure:
    """``runs``: predicted_vs_measured.csv (one row per run)."""
    per_unit_s, unit = duration_unit(
        float(max(runs["predicted_step_time_s"].max(), runs["measured_step_time_s"].max()))
    )
    labels = [f"{r} {p}" for r, p in zip(runs["run"], runs["plan"])]
    fig = go.Figure()
    fig.add_bar(name="predicted", x=labels, y=runs["predicted_step_time_s"] / per_unit_s, marker_color="#4C72B0")
    fig.add_bar(
        name="measured (median)",
        x=labels,
        y=runs["measured_step_time_s"] / per_unit_s,
        marker_color="#DD8452",
        text=[f"x{ratio:.2f}" for ratio in runs["measured_over_predicted"]],
        textposition="outside",
    )
    fig.update_layout(barmode="group", title="predicted against measured step time", yaxis_title=f"step time ({unit})")
    return fig
