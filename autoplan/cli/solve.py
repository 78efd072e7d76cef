"""``autoplan plan MODEL.py --devices N --profile P --batch B [--top-k K] [--fix ...]
[--objective time|cost] [--tokens N | --steps N] [--spot] [--deadline D] [--budget $] --out DIR``,
and ``autoplan sweep`` (cli/sweep.py): the planner's commands."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from collections.abc import Iterator

from autoplan.cli.sweep import add_sweep_parser
from autoplan.cli.trace import add_trace_arguments
from autoplan.cli.whole_run import add_run_arguments
from autoplan.solve.pins import FIX_KEYS
from autoplan.types.prediction import OBJECTIVES
from autoplan.types.runtime import RUNTIMES


def register(subparsers, common: argparse.ArgumentParser) -> None:
    parser = subparsers.add_parser(
        "plan",
        parents=[common],
        help="search the fastest hybrid parallel plan that fits",
        description="Trace MODEL.py, search every data/tensor/pipeline plan on the profiled cluster, "
        "write DIR/plan.json.",
    )
    parser.add_argument("model", metavar="MODEL.py", help="a model file (build_model, example_inputs)")
    parser.add_argument("--devices", type=int, required=True, help="number of devices")
    parser.add_argument("--profile", required=True, help="profile name (see profiles/) or path to a profile file")
    parser.add_argument("--batch", type=int, required=True, help="global batch size (samples per step)")
    parser.add_argument("--top-k", type=int, default=5, help="plans to show (default 5)")
    parser.add_argument(
        "--exact-top-k",
        action="store_true",
        help="rank every plan shown exactly (slower); by default the best is exact and the others are the best "
        "of the plans the search priced",
    )
    add_search_arguments(parser)
    parser.add_argument(
        "--objective",
        choices=OBJECTIVES,
        default="time",
        help="minimise step time, or dollars (of the whole run with --tokens/--steps, else per sample)",
    )
    parser.add_argument(
        "--solver", choices=("highs", "cbc"), default="highs", help="ILP backend (default HiGHS, CBC fallback)"
    )
    parser.add_argument("--time-limit", type=float, default=10.0, help="seconds per ILP solve (default 10)")
    parser.add_argument(
        "--jobs",
        type=int,
        default=0,
        metavar="N",
        help="processes to search on (default 0: AUTOPLAN_JOBS, else one per core, at most 4; Linux only): the "
        "best plan is the same, the plans priced beside it depend on N",
    )
    add_runtime_argument(parser)
    add_search_cache_argument(parser)
    parser.add_argument(
        "--out", required=True, metavar="DIR", help="output folder for plan.json, plans.csv, ops.csv, stages.csv"
    )
    parser.add_argument(
        "--explain", action="store_true", help="also explain the choice (autoplan explain; see docs/cli.md)"
    )
    add_trace_arguments(parser)
    parser.add_argument(
        "--touched-rows",
        type=int,
        metavar="N",
        help="distinct rows of each sparse embedding table one rank's step reads (default: the uniform "
        "estimate V(1-(1-1/V)^tokens), an upper bound for text; docs/cost-model.md)",
    )
    add_run_arguments(parser)
    parser.set_defaults(func=run, out_kind="folder", exits_fast=True)  # cli/startup.py, exit_now
    add_sweep_parser(subparsers, common)


def add_search_arguments(parser: argparse.ArgumentParser) -> None:
    """The search's pins and permissions (``--fix``, ``--allow-*``): one definition for ``plan`` and
    ``explain --config``, read back by :func:`search_options`."""
    parser.add_argument(
        "--fix",
        action="append",
        default=[],
        metavar="KEY=VAL,...",
        help=f"pin part of the plan; keys: {', '.join(FIX_KEYS)}",
    )
    parser.add_argument(
        "--allow-lossy",
        action="store_true",
        help="also consider gradient reduction in bf16/fp16 and PowerSGD compression (lossy: docs/cost-model.md)",
    )
    add_fp8_argument(parser)


def add_search_cache_argument(parser: argparse.ArgumentParser) -> None:
    """``--no-search-cache``: one definition for ``plan`` and ``sweep`` (:func:`search_cache`)."""
    parser.add_argument(
        "--no-search-cache",
        action="store_true",
        help="neither read nor add to the search cache of pipeline schedules' analyses (also "
        "AUTOPLAN_SEARCH_CACHE=off; docs/ilp.md, The search cache)",
    )


def add_runtime_argument(parser: argparse.ArgumentParser) -> None:
    """``--runtime``: one definition for ``plan`` and ``sweep``."""
    parser.add_argument(
        "--runtime",
        choices=tuple(RUNTIMES),
        default="autoplan",
        help="the software that will run the plan, whose kernels and overlaps are priced: autoplan's executor "
        "(default; `autoplan run`), or a framework to `autoplan export` to (docs/cost-model.md, Runtimes)",
    )


def search_options(args: argparse.Namespace) -> dict:
    """``plan_graph``'s keyword arguments from :func:`add_search_arguments`' flags: ``fix`` and every ``allow_*``."""
    return {"fix": args.fix, **{name: value for name, value in vars(args).items() if name.startswith("allow_")}}


def add_fp8_argument(parser: argparse.ArgumentParser) -> None:
    """``--allow-fp8``: FP8 changes the numerics and its kernels need FP8 tensor cores, so the
    planner searches it only when asked (solve/space.py); ``--fix precision=fp8`` pins it."""
    parser.add_argument(
        "--allow-fp8",
        action="store_true",
        help="also consider FP8 linears where the profile has an FP8 peak (changes numerics: docs/cost-model.md)",
    )


#: What ``autoplan plan`` imports up front: the planner. torch and the tracer come only with a trace
#: that the trace cache does not hold (cli/trace.py, ``model_graph``).
PLAN_IMPORTS = ("autoplan.solve.api",)


def run(args: argparse.Namespace) -> int:
    from autoplan.cli.startup import frozen_imports

    with frozen_imports(*PLAN_IMPORTS):
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    from autoplan.cli.startup import paused_collector
    from autoplan.cli.trace import model_graph
    from autoplan.cli.whole_run import run_spec_of
    from autoplan.profile.io import load_profile, profile_file
    from autoplan.solve.api import NoPlanFits, plan_graph
    from autoplan.solve.console import search_progress
    from autoplan.solve.outputs import write_outputs

    spec = run_spec_of(args)  # bad whole-run flags fail before the trace
    from autoplan.solve.shares import usable_jobs

    usable_jobs(args.jobs)  # as a bad --jobs or AUTOPLAN_JOBS
    profile = load_profile(args.profile)
    if spec is not None:
        from autoplan.cost import check_prices, priced_profile

        profile = priced_profile(profile, spec)  # --price-per-device-hour and the spot flags, into profile.json
        check_prices(profile, spec, objective=args.objective)
    from autoplan.profile.host import device_mismatch

    if (warning := device_mismatch(profile, running=False)) and not args.json:
        print(f"autoplan: warning: {warning}", file=sys.stderr)
    from autoplan.solve.sparse_grads import with_touched_rows

    graph = with_touched_rows(model_graph(args), args.touched_rows)
    quiet = args.quiet or args.json
    try:  # the search makes next to no cyclic garbage: its collections only rescan what lives on (cli/startup.py)
        bar = search_progress(enabled=not quiet and sys.stderr.isatty())
        with search_cache(args), bar as progress, paused_collector():
            result = plan_graph(
                graph,
                devices=args.devices,
                profile=profile,
                batch_size=args.batch,
                objective=args.objective,
                solver=args.solver,
                time_limit_s=args.time_limit,
                jobs=args.jobs,
                progress=progress,
                top_k=args.top_k if args.exact_top_k else 1,  # pruning against the k-th best costs 2.3x
                run=spec,
                runtime=args.runtime,
                **search_options(args),
            )
    except NoPlanFits as exc:
        if exc.result is not None:
            write_outputs(args.out, result=exc.result, graph=graph, profile=profile, run=spec)
        raise
    if (source := profile_file(args.profile)) is not None:  # run --audit and calibrate load it again
        result.best.profile = source
    paths = write_outputs(args.out, result=result, graph=graph, profile=profile, run=spec)
    from autoplan.report.trace_events import TIMELINE_JSON, write_predicted_trace

    # the predicted step as a Perfetto trace (report/ draws it; solve/ may not import report/)
    paths[TIMELINE_JSON] = write_predicted_trace(args.out, plan=result.best, graph=graph, profile=profile)
    from autoplan.solve.notes import plan_notes

    notes = plan_notes(result, profile)  # little memory headroom; dp bound by a rule (solve/notes.py)
    explanation = _explain(result, graph, profile, args) if args.explain else None
    if args.json:
        extra = {"explanation": explanation.to_dict()} if explanation else {}
        print(
            json.dumps(
                {
                    "plan": result.best.to_dict(),
                    "files": {k: str(v) for k, v in paths.items()},
                    "warnings": notes,
                    **extra,
                },
                indent=2,
                default=str,
            )
        )
    elif not args.quiet:
        from autoplan.solve.console import goodput_line, stdout_console, top_table

        console = stdout_console()
        console.print(top_table(result, top_k=args.top_k, exact_k=args.top_k if args.exact_top_k else 1))
        console.print(f"best: {result.best.describe()}  ->  {paths['plan.json']}")
        console.print(goodput_line(result.best.predicted, profile), highlight=False)
        if result.best.predicted.run is not None:
            from autoplan.cost import run_summary

            console.print(run_summary(result.best.predicted.run), highlight=False)
    for note in [] if args.json or (explanation and not args.quiet) else notes:  # --explain states them
        print(f"autoplan: warning: {note}", file=sys.stderr)
    if explanation and not args.json:
        from autoplan.cli.report import print_explanation

        print_explanation(explanation, as_json=False, quiet=args.quiet)
    return 0


@contextlib.contextmanager
def search_cache(args: argparse.Namespace) -> Iterator[None]:
    """The search inside reads and adds to the search cache (cost/stored.py: ``$AUTOPLAN_SEARCH_CACHE``) unless
    ``--no-search-cache``; a cache it could not write is a warning."""
    from autoplan.cost import stored

    with stored.attached(None if args.no_search_cache else stored.cache_dir()) as notes:
        yield
    for note in notes:
        print(f"autoplan: warning: {note}", file=sys.stderr)


def _explain(result, graph, profile, args):
    """--explain: autoplan/report/explain.py on the search just run."""
    from autoplan.report.explain import explain

    return explain(result, graph=graph, profile=profile, objective=args.objective)
