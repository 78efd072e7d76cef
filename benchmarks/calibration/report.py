"""Accuracy metrics, the table, the CSV and the plot of the calibration benchmark.

Per plan: |predicted - measured| / measured. Per set of plans: the median and largest of those,
Spearman's rank correlation of predicted against measured (scipy.stats.spearmanr), and where the
planner's chosen plan ranks among the measured times (1 = fastest) with its gap to the fastest.
"""

from __future__ import annotations

import csv
import statistics
from pathlib import Path

from scipy.stats import spearmanr

from autoplan.types.cost import Cost

FIELDS = [
    "model",
    "plan",
    "split",
    "chosen",
    "measured_s",
    "predicted_s",
    "abs_pct_err",
    "calibrated_s",
    "calibrated_abs_pct_err",
    "measured_rank",
    "spread_pct",
    "predicted_peak_bytes",
    "measured_peak_bytes",
    "memory_err_pct",
    *Cost.TIME_FIELDS,
    "folder",
    "error",
]


def ape(predicted: float, measured: float) -> float:
    return abs(predicted - measured) / measured * 100.0


def signed_pct(predicted: float | None, measured: float | None) -> float | None:
    """(predicted - measured) / measured in %: negative is an under-prediction (an OOM risk)."""
    return None if not predicted or not measured else (predicted - measured) / measured * 100.0


def metrics(rows: list[dict], *, predicted: str = "predicted_s") -> dict:
    ok = [r for r in rows if r["measured_s"]]
    if not ok:
        return {"plans": 0}
    errors = [ape(r[predicted], r["measured_s"]) for r in ok]
    rho = (
        spearmanr([r[predicted] for r in ok], [r["measured_s"] for r in ok]).statistic if len(ok) > 2 else float("nan")
    )
    out = {
        "plans": len(ok),
        "median_abs_pct": statistics.median(errors),
        "max_abs_pct": max(errors),
        "spearman": float(rho),
    }
    memory = [r["memory_err_pct"] for r in ok if r.get("memory_err_pct") is not None]
    if memory:
        out["memory_median_abs_pct"] = statistics.median(abs(e) for e in memory)
        out["memory_worst_under_pct"] = min(memory)
    chosen = [r for r in ok if r["chosen"]]
    if chosen:
        fastest = min(r["measured_s"] for r in ok)
        out["chosen_rank"] = chosen[0]["measured_rank"]
        out["chosen_gap_pct"] = (chosen[0]["measured_s"] / fastest - 1.0) * 100.0
    return out


def rank(rows: list[dict]) -> None:
    ordered = sorted((r for r in rows if r["measured_s"]), key=lambda r: r["measured_s"])
    for index, row in enumerate(ordered, start=1):
        row["measured_rank"] = index


def write_csv(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=FIELDS, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)


def print_table(rows: list[dict], summaries: dict[str, dict]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="calibration benchmark: step time per plan (s)")
    for column in (
        "model",
        "plan",
        "split",
        "measured",
        "IQR %",
        "predicted",
        "err %",
        "calibrated",
        "err %",
        "rank",
        "mem err %",
    ):
        table.add_column(column)
    for r in sorted(rows, key=lambda r: (r["model"], r["measured_s"] or 1e9)):
        flag = " *" if r["chosen"] else ""
        table.add_row(
            r["model"],
            r["plan"] + flag,
            r["split"],
            _f(r["measured_s"]),
            _f(r.get("spread_pct"), 0),
            _f(r["predicted_s"]),
            _f(r["abs_pct_err"], 1),
            _f(r["calibrated_s"]),
            _f(r["calibrated_abs_pct_err"], 1),
            str(r.get("measured_rank") or r["error"][:40]),
            _f(r.get("memory_err_pct"), 1),
        )
    console = Console(width=160)
    console.print(table)
    summary = Table(title="accuracy (* = the planner's chosen plan)")
    for column in (
        "set",
        "plans",
        "median |err| %",
        "max |err| %",
        "spearman",
        "chosen rank",
        "chosen vs fastest %",
        "memory median |err| %",
        "memory worst under %",
    ):
        summary.add_column(column)
    for name, m in summaries.items():
        summary.add_row(
            name,
            str(m.get("plans")),
            _f(m.get("median_abs_pct"), 1),
            _f(m.get("max_abs_pct"), 1),
            _f(m.get("spearman"), 3),
            str(m.get("chosen_rank", "")),
            _f(m.get("chosen_gap_pct"), 1),
            _f(m.get("memory_median_abs_pct"), 1),
            _f(m.get("memory_worst_under_pct"), 1),
        )
    console.print(summary)


def _f(value, digits: int = 4) -> str:
    return "" if value is None or value == "" else f"{value:.{digits}f}"


def plot(path: Path, rows: list[dict]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in rows if r["measured_s"]]
    fig, axes = plt.subplots(1, 2, figsize=(11, 5), sharex=True, sharey=True)
    for ax, column, title in (
        (axes[0], "predicted_s", "profile as measured"),
        (axes[1], "calibrated_s", "calibrated (fit on 'train' plans)"),
    ):
        for model, marker in zip(sorted({r["model"] for r in ok}), "os^D"):
            for split, fill in (("train", "none"), ("held_out", None)):
                pts = [r for r in ok if r["model"] == model and r["split"] == split]
                ax.scatter(
                    [r["measured_s"] for r in pts],
                    [r[column] for r in pts],
                    marker=marker,
                    label=f"{model} {split}",
                    facecolors=fill,
                    edgecolors="C0" if model == "gpt" else "C1",
                    color=None if fill else ("C0" if model == "gpt" else "C1"),
                )
        low = min(min(r["measured_s"], r["predicted_s"], r["calibrated_s"]) for r in ok) * 0.8
        high = max(max(r["measured_s"], r["predicted_s"], r["calibrated_s"]) for r in ok) * 1.25
        ax.plot([low, high], [low, high], "k-", lw=1)
        ax.fill_between(
            [low, high], [low * 0.8, high * 0.8], [low * 1.2, high * 1.2], color="grey", alpha=0.15, label="±20%"
        )
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("measured step time (s)")
        ax.set_title(title)
    axes[0].set_ylabel("predicted step time (s)")
    axes[1].legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
