"""The console view of a search: a progress bar while it runs, a table of the top plans, and
one line on the best plan's checkpoints and expected goodput (or why they are not priced); for a
sweep (solve/cluster.py), the table of its Pareto front.

Rich renders both on stderr-friendly terminals; with ``--quiet`` or ``--json`` nothing but the
JSON (or nothing) reaches stdout. rich is imported only when something is drawn.
"""

from __future__ import annotations

import sys
from contextlib import contextmanager
from typing import TYPE_CHECKING, Iterator

if TYPE_CHECKING:
    from rich.console import Console

    from autoplan.display import FitTable
    from autoplan.solve.candidates import SearchResult
    from autoplan.solve.cluster import SweepResult
    from autoplan.types.prediction import Prediction
    from autoplan.types.profile import Profile


def stdout_console() -> Console:
    """A console for tables: the terminal's width (or ``COLUMNS``), else 160 columns when piped."""
    import os

    from rich.console import Console

    return Console() if sys.stdout.isatty() or "COLUMNS" in os.environ else Console(width=160)


@contextmanager
def search_progress(*, enabled: bool, label: str = "searching plans") -> Iterator:
    """A callback ``(done, total)`` that drives a progress bar on stderr (a no-op when disabled)."""
    if not enabled:
        yield None
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (TextColumn(label), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=Console(stderr=True), transient=True) as progress:
        task = progress.add_task("search", total=None)

        def update(done: int, total: int) -> None:
            progress.update(task, completed=done, total=total)

        yield update


def _exactness(*, top_k: int, exact_k: int) -> str:
    """The title's note on which rows the search ranked exactly."""
    if exact_k >= top_k:
        return ""
    first = "#1 is" if exact_k == 1 else f"#1-{exact_k} are"
    return f"; {first} exact, #{exact_k + 1}-{top_k} the best of those priced (--exact-top-k ranks them all)"


def top_table(result: SearchResult, *, top_k: int, exact_k: int | None = None) -> FitTable:
    """The best ``top_k`` feasible plans with their step-time terms (autoplan/display.py names),
    in the unit of the best step time; a term that is zero for every plan shown is left out. The search
    ranked the first ``exact_k`` (default all) exactly; the title says when the rest are only the best of
    the plans it priced (each price exact, but a pruned plan may have been faster)."""
    from autoplan.display import TERM_NAMES, FitTable, duration_unit, number_text

    top = result.ranked()[:top_k]
    scale, unit = duration_unit(top[0].cost.step_time_s if top else 1.0)
    terms = [t for t in TERM_NAMES if t == "compute_s" or any(getattr(c.cost, t) for c in top)]
    headers = ["#", "plan", f"step {unit}", *(TERM_NAMES[t].header for t in terms), "mem GiB", "MFU"]
    left_out = len(TERM_NAMES) - len(terms)
    table = FitTable(
        headers=headers,
        numbers=set(headers) - {"plan"},
        title=f"top {top_k} plans ({result.evaluated} priced, {result.pruned} pruned, {result.elapsed_s:.2f} s"
        + (f" on {result.processes} processes)" if result.processes > 1 else ")")
        + _exactness(top_k=min(top_k, len(top)), exact_k=top_k if exact_k is None else exact_k),
        caption=f"times in {unit}; {left_out} terms that are zero for every plan shown are left out" * bool(left_out),
    )
    for rank, c in enumerate(top, start=1):
        cost = c.cost
        table.add_row(
            str(rank),
            c.plan.describe(),
            number_text(cost.step_time_s / scale),
            *(number_text(getattr(cost, t) / scale) for t in terms),
            number_text(cost.peak_memory_bytes / 2**30),
            f"{cost.mfu:.1%}",
        )
    return table


def goodput_line(prediction: Prediction, profile: Profile) -> str:
    """The best plan's checkpoint interval and expected goodput (cost/run/reliability.py), or the
    one sentence that says why the profile cannot price them."""
    from autoplan.cost import reliability_not_priced, reliability_summary

    if not prediction.has_goodput:
        return reliability_not_priced(profile) or "checkpoint interval and goodput not priced."
    return reliability_summary(prediction.to_dict()) + " (the same for every plan on this cluster)."


def pareto_table(result: SweepResult) -> FitTable:
    """The sweep's Pareto front, fastest first: time and dollars of the whole run, the plan, and
    a star on the recommended point."""
    from autoplan.display import FitTable, hours_text, usd_text

    spot = " (spot)" if result.spec.spot else ""
    headers = ["pick", "cluster", "rent", "plan", "step s", "time", "device-h", "cost", "goodput"]
    table = FitTable(
        headers=headers,
        numbers={"step s", "time", "device-h", "cost", "goodput"},
        title=f"Pareto front: whole-run time vs cost{spot} ({len(result.planned)} points planned, "
        f"{result.plan_calls} of {result.grid_size} searched, {result.elapsed_s:.1f} s)",
    )
    for row in result.pareto:
        estimate = row.estimate
        goodput = estimate.spot_goodput if result.spec.spot else estimate.goodput
        table.add_row(
            "*" if row is result.recommended else "",
            row.label,
            row.rental(),
            row.plan.describe(),
            f"{estimate.step_time_s:.3g}",
            hours_text(row.wall_h),
            f"{(estimate.spot_device_hours if result.spec.spot else estimate.device_hours):,.0f}",
            usd_text(row.dollars),
            "-" if estimate.goodput_note else f"{goodput:.1%}",
        )
    return table
