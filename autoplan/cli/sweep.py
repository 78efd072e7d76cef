"""``autoplan sweep MODEL.py --devices 8..1024 --profile aws-p4d,aws-p5 --batch B --tokens N
[--spot] [--deadline D] [--budget $] --out DIR``: which cluster to rent (solve/cluster.py).

Registered by cli/solve.py (the planner's command module). Writes DIR/sweep.csv, DIR/pareto.png
and the recommended point's DIR/plan.json; prints the Pareto table and one sentence.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from autoplan.cli.trace import add_trace_arguments
from autoplan.cli.whole_run import add_run_arguments


def add_sweep_parser(subparsers, common: argparse.ArgumentParser) -> None:
    from autoplan.cli.solve import add_runtime_argument, add_search_cache_argument  # cli/solve.py registers it

    parser = subparsers.add_parser(
        "sweep",
        parents=[common],
        help="choose the cluster: plan across sizes and instances, the time/cost Pareto front",
        description="Trace MODEL.py once, plan it on every (profile, device count), print the Pareto front of "
        "whole-run time and cost and recommend what to rent.",
    )
    parser.add_argument("model", metavar="MODEL.py", help="a model file (build_model, example_inputs)")
    parser.add_argument(
        "--devices", required=True, help="device counts: a range (8..1024: its powers of two) or a list (16,64)"
    )
    parser.add_argument(
        "--profile", required=True, help="comma-separated profile names or paths (aws-p4d,aws-p5 or p4d,p5)"
    )
    parser.add_argument("--batch", type=int, required=True, help="global batch size (samples per step)")
    parser.add_argument("--fix", action="append", default=[], metavar="KEY=VAL,...", help="pin part of every plan")
    parser.add_argument("--solver", choices=("highs", "cbc"), default="highs", help="ILP backend")
    parser.add_argument("--time-limit", type=float, default=10.0, help="seconds per ILP solve (default 10)")
    parser.add_argument(
        "--allow-lossy", action="store_true", help="let every point pick lossy gradient sync (as autoplan plan)"
    )
    parser.add_argument("--allow-fp8", action="store_true", help="let every point pick FP8 linears (as autoplan plan)")
    parser.add_argument("--no-prune", action="store_true", help="plan every point (slower; same front)")
    parser.add_argument(
        "--jobs", type=int, default=0, metavar="N", help="processes each point's search runs on (as autoplan plan)"
    )
    add_runtime_argument(parser)
    add_search_cache_argument(parser)
    parser.add_argument("--out", required=True, metavar="DIR", help="output folder for sweep.csv and pareto.png")
    add_trace_arguments(parser)
    add_run_arguments(parser)
    parser.set_defaults(func=run, out_kind="folder", exits_fast=True)  # cli/startup.py, exit_now


def run(args: argparse.Namespace) -> int:
    from autoplan.cli.solve import PLAN_IMPORTS
    from autoplan.cli.startup import frozen_imports

    with frozen_imports(*PLAN_IMPORTS):
        return _run(args)


def _devices(text: str):
    return text if ".." in text else [part for part in text.split(",") if part.strip()]


def _run(args: argparse.Namespace) -> int:
    from autoplan.cli.solve import search_cache
    from autoplan.cli.trace import model_graph
    from autoplan.cli.whole_run import run_spec_of
    from autoplan.errors import PlanError
    from autoplan.solve.cluster import NoClusterMeets, device_counts, sweep_graph
    from autoplan.solve.console import search_progress

    spec = run_spec_of(args)
    if spec is None or not spec.has_length:
        raise PlanError("autoplan sweep compares whole runs: pass --tokens N or --steps N.")
    devices = _devices(args.devices)
    device_counts(devices)  # a bad --devices fails before the trace
    from autoplan.solve.shares import usable_jobs

    usable_jobs(args.jobs)  # as a bad --jobs or AUTOPLAN_JOBS
    profiles = [name.strip() for name in args.profile.split(",") if name.strip()]
    graph = model_graph(args)
    quiet = args.quiet or args.json
    try:
        bar = search_progress(enabled=not quiet and sys.stderr.isatty(), label="sweeping clusters")
        with search_cache(args), bar as progress:
            result = sweep_graph(
                graph,
                devices=devices,
                profiles=profiles,
                batch_size=args.batch,
                run=spec,
                fix=args.fix,
                solver=args.solver,
                time_limit_s=args.time_limit,
                prune=not args.no_prune,
                progress=progress,
                allow_lossy=args.allow_lossy,
                allow_fp8=args.allow_fp8,
                runtime=args.runtime,
                jobs=args.jobs,
            )
    except NoClusterMeets as exc:
        if exc.result.planned:
            _write(args.out, exc.result, graph)
        raise
    paths = _write(args.out, result, graph)
    if args.json:
        print(json.dumps(_as_json(result, paths), indent=2, default=str))
    elif not args.quiet:
        from autoplan.solve.console import pareto_table, stdout_console

        console = stdout_console()
        console.print(pareto_table(result))
        console.print(result.recommendation, highlight=False)
        console.print(f"files: {', '.join(str(p) for p in paths.values())}", highlight=False)
    return 0


def _write(out: str, result, graph) -> dict[str, Path]:
    """sweep.csv and pareto.png; with a recommended point, its plan folder's files too (plan.json,
    plans.csv, ops.csv, stages.csv, graph.json, profile.json: solve/outputs.py), so that
    ``autoplan report``, ``explain``, ``export`` and ``run`` take the sweep folder as a plan folder."""
    from autoplan.report.pareto import pareto_figure
    from autoplan.solve.outputs import sweep_csv, write_outputs
    from autoplan.types._check import write_text_atomic

    folder = Path(out)
    paths = {"sweep.csv": write_text_atomic(folder / "sweep.csv", sweep_csv(result))}
    paths["pareto.png"] = pareto_figure(result, folder / "pareto.png")
    if (pick := result.recommended) is not None:
        paths |= write_outputs(folder, result=pick.search, graph=graph, profile=pick.priced, run=result.spec)
    return paths


def _as_json(result, paths: dict[str, Path]) -> dict:
    def row(r) -> dict:
        return {
            "profile": r.profile,
            "devices": r.devices,
            "status": r.status,
            "pareto": r.pareto,
            "plan": r.plan.describe() if r.plan else None,
            "run": r.estimate.to_dict() if r.estimate else None,
            "reason": r.reason,
        }

    return {
        "recommendation": result.recommendation,
        "rule": result.rule,
        "recommended": row(result.recommended) if result.recommended else None,
        "pareto": [row(r) for r in result.pareto],
        "rows": [row(r) for r in result.rows],
        "plan_calls": result.plan_calls,
        "grid_size": result.grid_size,
        "elapsed_s": result.elapsed_s,
        "files": {k: str(v) for k, v in paths.items()},
    }
