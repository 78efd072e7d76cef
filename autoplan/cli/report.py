"""``autoplan report DIR [RUNDIR...] --out REPORTDIR``, ``autoplan explain DIR`` (or ``--config FILE``)
and ``autoplan export`` (autoplan/cli/export.py)."""

from __future__ import annotations

import argparse
import json
import sys

from autoplan.cli.export import add_config_arguments, add_export_parser, refuse_config_flags_without_config


def register(subparsers, common: argparse.ArgumentParser) -> None:
    report = subparsers.add_parser(
        "report",
        parents=[common],
        help="turn a plan folder and its runs into tables, figures, report.md and report.html",
        description="Write tidy CSVs, PNG figures (timeline, memory, breakdown, predicted vs measured), "
        "explain.md, report.md and report.html (one page with interactive figures that opens in a browser, "
        "offline) for a plan folder and any run folders of it.",
    )
    report.add_argument("plan_dir", metavar="DIR", help="a plan folder (autoplan plan --out DIR)")
    report.add_argument(
        "run_dirs", metavar="RUNDIR", nargs="*", help="run folders of that plan (autoplan run --out RUNDIR)"
    )
    report.add_argument("--out", required=True, metavar="REPORTDIR", help="folder to write the report to")
    report.add_argument("--top-k", type=int, default=5, help="plans to compare in the tables and figures (default 5)")
    report.add_argument("--no-explain", action="store_true", help="skip the explanation (it re-runs the search)")
    report.set_defaults(func=run_report, out_kind="folder")
    explain = subparsers.add_parser(
        "explain",
        parents=[common],
        help="explain why the planner chose its plan",
        description="Compare the chosen plan with its nearest rivals term by term, find what would "
        "change the decision, and say why each other (dp, tp, pp) family lost.",
    )
    explain.add_argument("plan_dir", metavar="DIR", nargs="?", help="a plan folder (autoplan plan --out DIR)")
    explain.add_argument("--rivals", type=int, default=3, help="nearest rivals to compare (default 3)")
    add_config_arguments(explain)
    explain.set_defaults(func=run_explain)
    add_export_parser(subparsers, common)


def run_report(args: argparse.Namespace) -> int:
    from autoplan.errors import AutoplanError
    from autoplan.report.api import report

    if args.top_k < 1:
        raise AutoplanError(f"--top-k {args.top_k}: expected at least 1.")
    with _status("writing the report", enabled=not (args.quiet or args.json)):
        paths = report(args.plan_dir, args.run_dirs, out=args.out, top_k=args.top_k, explain=not args.no_explain)
    if args.json:
        print(json.dumps({name: str(path) for name, path in paths.items()}, indent=2))
    elif not args.quiet:
        print(f"wrote {len(paths)} files to {args.out}: {', '.join(sorted(paths))}")
        if "timeline_diff.csv" in paths:
            print_timeline_diff(paths["timeline_diff.csv"])
    return 0


def print_timeline_diff(path, *, rows: int = 10) -> None:
    """The largest differences of timeline_diff.csv (report/trace_diff.py): what took longer than priced."""
    from autoplan.display import FitTable, duration_text
    from autoplan.errors import AutoplanError
    from autoplan.solve.console import stdout_console
    from autoplan.types.tables import read_table

    frame = read_table(path, error=AutoplanError, rerun="autoplan report").dropna(subset=["diff_ms"]).head(rows)
    table = FitTable(
        headers=["stage", "event", "predicted", "measured", "longer by", "x"],
        numbers={"predicted", "measured", "longer by", "x"},
        title="measured against predicted, per stage and event (largest differences first)",
        caption=f"every row: {path}",
    )
    for r in frame.itertuples():
        longer = duration_text(r.diff_ms / 1e3, signed=True)
        table.add_row(
            r.stage, r.event, duration_text(r.predicted_s), duration_text(r.measured_s), longer, f"{r.ratio:.2f}"
        )
    stdout_console().print(table)


def run_explain(args: argparse.Namespace) -> int:
    from autoplan.errors import AutoplanError
    from autoplan.report.explain import explain

    if args.config:
        from autoplan.cli.export import run_explain_config

        return run_explain_config(args)
    if not args.plan_dir:
        raise AutoplanError("explain needs a plan folder (autoplan plan --out DIR) or --config FILE.")
    refuse_config_flags_without_config(args)

    with _status("re-running the search and re-pricing rivals", enabled=not (args.quiet or args.json)):
        exp = explain(args.plan_dir, rivals=args.rivals)
    print_explanation(exp, as_json=args.json, quiet=args.quiet)
    return 0


def print_explanation(exp, *, as_json: bool, quiet: bool) -> None:
    """Print an Explanation: Markdown rendered by rich, or JSON on stdout."""
    if as_json:
        print(json.dumps(exp.to_dict(), indent=2, default=str))
    elif not quiet:
        from autoplan.cli.rendering import FitMarkdown
        from autoplan.solve.console import stdout_console

        stdout_console().print(FitMarkdown(exp.to_markdown()))


def print_markdown(text: str) -> None:
    """Render Markdown on stdout with rich."""
    from autoplan.cli.rendering import FitMarkdown
    from autoplan.solve.console import stdout_console

    stdout_console().print(FitMarkdown(text))


def _status(message: str, *, enabled: bool):
    from contextlib import nullcontext

    if not enabled or not sys.stderr.isatty():
        return nullcontext()
    from rich.console import Console

    return Console(stderr=True).status(message)
