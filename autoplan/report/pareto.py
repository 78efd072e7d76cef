"""``pareto.png`` of ``autoplan sweep``: every planned (profile, devices) point of a sweep
(solve/cluster.py), whole-run wall time against dollars, one colour per profile, the Pareto
front joined and labelled, the recommended point circled. Log-log axes: a sweep spans decades of
both. matplotlib with the Agg backend (report/figures.py)."""

from __future__ import annotations

from pathlib import Path

from matplotlib.ticker import FuncFormatter

from autoplan.report.figures import TERM_COLORS, plt, save_png


def pareto_figure(result, path: str | Path) -> Path:
    """Draw the sweep's points and front (module docstring) into ``path``."""
    fig, ax = plt.subplots(figsize=(8.5, 5.5))
    planned = result.planned
    days = max(r.wall_h for r in planned) >= 48
    scale, unit = (1 / 24, "days") if days else (1.0, "hours")
    for index, name in enumerate(dict.fromkeys(r.profile for r in planned)):
        mine = [r for r in planned if r.profile == name]
        ax.scatter(
            [r.wall_h * scale for r in mine],
            [r.dollars for r in mine],
            color=TERM_COLORS[index % len(TERM_COLORS)],
            label=name,
            s=28,
            zorder=3,
        )
    front = result.pareto
    ax.plot([r.wall_h * scale for r in front], [r.dollars for r in front], color="black", lw=1.2, zorder=2)
    for row in front:
        ax.annotate(row.label, (row.wall_h * scale, row.dollars), textcoords="offset points", xytext=(5, 4), fontsize=7)
    if result.recommended is not None:
        pick = result.recommended
        ax.scatter([pick.wall_h * scale], [pick.dollars], s=180, facecolors="none", edgecolors="red", lw=1.5, zorder=4)
    for value, draw in ((result.spec.deadline_h, ax.axvline), (result.spec.budget_usd, ax.axhline)):
        if value is not None:
            draw(value * scale if draw is ax.axvline else value, color="grey", ls="--", lw=1)
    ax.set_xscale("log")
    ax.set_yscale("log")
    for axis, text in ((ax.xaxis, "{:g}"), (ax.yaxis, "${:,.0f}")):
        axis.set_major_formatter(FuncFormatter(lambda value, _, text=text: text.format(value)))
        axis.set_minor_formatter(FuncFormatter(lambda value, _, text=text: text.format(value)))
    spot = " on spot" if result.spec.spot else ""
    ax.set_xlabel(f"expected wall time of the run{spot} ({unit})")
    ax.set_ylabel(f"expected cost of the run{spot} (USD)")
    ax.set_title("Whole-run time vs cost: Pareto front (line), recommended (red circle)", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    return save_png(fig, Path(path))
