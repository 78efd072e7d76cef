"""The report's pictures: matplotlib with the Agg backend (no display), PNG, written atomically.

- ``timeline.png``: one row per pipeline stage; forward, backward, send, sync/optimizer and
  idle segments of one step (autoplan/report/timeline.py), labelled by micro-batch.
- ``memory.png``: per plan (those of ``breakdown.png``), the most loaded device's priced peak,
  stacked from the weights, gradients, optimizer states, activations and communication buffers
  alive at that moment (autoplan/report/memory.py), against the device capacity and the usable
  limit.
- ``breakdown.png``: the step-time terms of the top-k plans side by side, stacked.
- ``predicted_vs_measured.png``: per run, predicted beside median measured step time.
"""

from __future__ import annotations

import os
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from autoplan.display import TERM_NAMES, duration_unit  # noqa: E402
from autoplan.report.memory import MemoryBar  # noqa: E402
from autoplan.report.timeline import Timeline  # noqa: E402
from autoplan.types._check import temp_file_beside  # noqa: E402
from autoplan.types.cost import Cost  # noqa: E402

GIB = 2**30
COLORS = {
    "forward": "#4C72B0",
    "backward": "#DD8452",
    "weight": "#937860",  # a zero-bubble schedule's deferred weight gradients (report/timeline.py)
    "send": "#C44E52",
    "sync": "#8172B3",
    "idle": "#DDDDDD",
}
#: the legend's words for each kind of timeline segment (timeline.png and report.html's timeline)
KIND_LABELS = {
    "forward": "forward",
    "backward": "backward (input gradients when split)",
    "weight": "weight gradients",
    "send": "send/recv",
    "sync": "dp sync + optimizer",
    "idle": "idle (bubble)",
}
MEMORY_COLORS = ("#4C72B0", "#55A868", "#C44E52", "#DD8452", "#8172B3")
TERM_COLORS = (
    "#4C72B0",
    "#937860",
    "#C44E52",
    "#DA8BC3",
    "#CCB974",
    "#8C8C8C",
    "#DDDDDD",
    "#64B5CD",
    "#55A868",
    "#8172B3",
)


def save_png(fig, path: Path) -> Path:
    """Save ``fig`` to ``path`` through a temporary file and a rename; close it."""
    fd, tmp = temp_file_beside(path, suffix=".png")  # mode as a plain write gives (types/_check.py)
    os.close(fd)
    try:
        fig.savefig(tmp, dpi=120, bbox_inches="tight")
        os.replace(tmp, path)
    finally:
        plt.close(fig)
        Path(tmp).unlink(missing_ok=True)
    return path


def timeline_figure(timeline: Timeline, path: Path, *, title: str) -> Path:
    fig, ax = plt.subplots(figsize=(11, 1.0 + 0.6 * timeline.pp))
    scale, unit = _time_unit(timeline.makespan_s)
    for seg in timeline.segments:
        row = timeline.pp - 1 - seg.stage
        ax.broken_barh(
            [(seg.start_s * scale, (seg.end_s - seg.start_s) * scale)],
            (row - 0.4, 0.8),
            facecolors=COLORS[seg.kind],
            edgecolor="white",
            linewidth=0.5,
        )
        wide = (seg.end_s - seg.start_s) / max(timeline.makespan_s, 1e-30) > 0.02
        if seg.kind in ("forward", "backward", "weight") and wide:
            ax.text(
                (seg.start_s + seg.end_s) / 2 * scale,
                row,
                str(seg.microbatch),
                ha="center",
                va="center",
                fontsize=7,
                color="white",
            )
    ax.set_yticks(range(timeline.pp), [f"stage {timeline.pp - 1 - r}" for r in range(timeline.pp)])
    ax.set_xlabel(f"time ({unit})")
    ax.set_title(title + (f"\n{timeline.note}" if timeline.note else ""), fontsize=9)
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in COLORS.values()]
    ax.legend(
        handles,
        [KIND_LABELS[kind] for kind in COLORS],
        loc="upper center",
        bbox_to_anchor=(0.5, -0.25 if timeline.pp > 2 else -0.45),
        ncol=6,
        fontsize=8,
        frameon=False,
    )
    return save_png(fig, path)


def _time_unit(seconds: float) -> tuple[float, str]:
    """(units per second, unit) of autoplan/display.py's choice for ``seconds``."""
    per_unit_s, unit = duration_unit(seconds)
    return 1.0 / per_unit_s, unit


def memory_figure(bars: list[MemoryBar], path: Path, *, capacity_bytes: float, usable_bytes: float) -> Path:
    """``bars``: each plan's priced peak split into the parts alive then (autoplan/report/memory.py);
    each stack sums to its peak, the number written above it."""
    fig, ax = plt.subplots(figsize=(max(5, 1.6 * len(bars) + 2), 4.5))
    names = list(dict.fromkeys(name for bar in bars for name in bar.parts_bytes))
    bottoms = [0.0] * len(bars)
    for name, color in zip(names, MEMORY_COLORS * 2):
        values = [bar.parts_bytes.get(name, 0.0) / GIB for bar in bars]
        ax.bar(range(len(bars)), values, bottom=bottoms, color=color, label=name)
        bottoms = [b + v for b, v in zip(bottoms, values)]
    for x, bar in enumerate(bars):
        ax.text(
            x,
            bar.peak_bytes / GIB,
            f"{bar.peak_bytes / GIB:.2f} GiB\n{100 * bar.peak_bytes / usable_bytes:.0f}% of usable",
            ha="center",
            va="bottom",
            fontsize=7,
        )
    ax.axhline(
        capacity_bytes / GIB,
        color="black",
        linestyle="-",
        linewidth=1,
        label=f"capacity {capacity_bytes / GIB:.1f} GiB",
    )
    ax.axhline(
        usable_bytes / GIB, color="black", linestyle="--", linewidth=1, label=f"usable {usable_bytes / GIB:.1f} GiB"
    )
    ax.set_xticks(range(len(bars)), [_wrap(bar.label) for bar in bars], fontsize=7)
    ax.set_ylabel("GiB per device at the priced peak (most loaded)")
    ax.set_title("memory per device at its peak", fontsize=10)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return save_png(fig, path)


def _wrap(label: str) -> str:
    words = label.split()
    return "\n".join(" ".join(words[i : i + 3]) for i in range(0, len(words), 3))


def breakdown_figure(breakdown: pd.DataFrame, path: Path) -> Path:
    """``breakdown``: the long table of autoplan/report/tables.py (rank, plan, term, seconds)."""
    wide = breakdown.pivot_table(index=["rank", "plan"], columns="term", values="seconds", aggfunc="sum").reset_index()
    fig, ax = plt.subplots(figsize=(max(5, 1.6 * len(wide) + 2), 4.5))
    total = wide[[t for t in Cost.TIME_FIELDS if t in wide]].sum(axis=1).max() if len(wide) else 0.0
    scale, unit = _time_unit(total)
    bottoms = [0.0] * len(wide)
    for term, color in zip(Cost.TIME_FIELDS, TERM_COLORS):
        values = (wide[term] * scale).tolist() if term in wide else [0.0] * len(wide)
        ax.bar(range(len(wide)), values, bottom=bottoms, color=color, label=TERM_NAMES[term].words)
        bottoms = [b + v for b, v in zip(bottoms, values)]
    ax.set_xticks(range(len(wide)), [f"#{r}\n{_wrap(p)}" for r, p in zip(wide["rank"], wide["plan"])], fontsize=7)
    ax.set_ylabel(f"step time ({unit})")
    ax.set_title("step-time breakdown of the top plans", fontsize=10)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return save_png(fig, path)


def predicted_measured_figure(runs: pd.DataFrame, path: Path) -> Path:
    """``runs``: the predicted_vs_measured table (one row per run)."""
    fig, ax = plt.subplots(figsize=(max(5, 1.5 * len(runs) + 2), 4))
    scale, unit = _time_unit(max(runs["predicted_step_time_s"].max(), runs["measured_step_time_s"].max()))
    xs = list(range(len(runs)))
    ax.bar([x - 0.2 for x in xs], runs["predicted_step_time_s"] * scale, width=0.4, color="#4C72B0", label="predicted")
    ax.bar(
        [x + 0.2 for x in xs],
        runs["measured_step_time_s"] * scale,
        width=0.4,
        color="#DD8452",
        label="measured (median)",
    )
    for x, (_, row) in zip(xs, runs.iterrows()):
        ax.text(
            x,
            max(row["predicted_step_time_s"], row["measured_step_time_s"]) * scale,
            f"x{row['measured_over_predicted']:.2f}",
            ha="center",
            va="bottom",
            fontsize=8,
        )
    ax.set_xticks(xs, [_wrap(f"{r} {p}") for r, p in zip(runs["run"], runs["plan"])], fontsize=7)
    ax.set_ylabel(f"step time ({unit})")
    ax.set_title("predicted against measured step time", fontsize=10)
    ax.legend(fontsize=8)
    return save_png(fig, path)
