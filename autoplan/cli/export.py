"""``autoplan export PLAN --to torchtitan|megatron|deepspeed|accelerate`` and ``autoplan explain
--config FILE`` (registered by the report stage's command module, autoplan/cli/report.py:
both turn a plan into something to read or hand on).

``export`` writes the framework's own config (autoplan/export/), prints each thing the
framework cannot express as a warning (they are comments in the file too) and the framework's
launch command. ``explain --config`` reads a framework's config back, traces the model at its
global batch, refuses a config written for another model, and prices it beside the best plan for
the same devices at the config's own precision, with ``plan``'s ``--fix`` and ``--allow-*``
(export/pricing.py).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def add_export_parser(subparsers, common: argparse.ArgumentParser) -> None:
    from autoplan.export.common import FRAMEWORKS

    parser = subparsers.add_parser(
        "export",
        parents=[common],
        help="write a plan as torchtitan, Megatron-LM, DeepSpeed or Accelerate configuration",
        description="Write the plan in a trainer's own config format; what the trainer cannot express is "
        "named in the file and as a warning (docs/export.md).",
    )
    parser.add_argument("plan", metavar="PLAN", help="a plan folder (autoplan plan --out DIR) or a plan.json")
    parser.add_argument("--to", required=True, choices=FRAMEWORKS, help="the framework to export to")
    parser.add_argument(
        "--out",
        metavar="FILE|DIR/",
        help="where to write: a file, or a folder (existing, or ending in /) for the framework's file name "
        "(default: that name here)",
    )
    parser.add_argument(
        "--model", metavar="MODEL.py", help="the model file the config will train: refused if the plan is for another"
    )
    parser.add_argument(
        "--format",
        choices=("py", "toml"),
        help="torchtitan only: py, a config function for torchtitan >= 0.3 (default), or toml for 0.2.x",
    )
    parser.set_defaults(func=run_export, out_kind="file_or_folder")


def add_config_arguments(explain: argparse.ArgumentParser) -> None:
    """``explain --config FILE --model MODEL.py --profile P``: price an existing config."""
    from autoplan.cli.solve import add_search_arguments
    from autoplan.export.common import FRAMEWORKS

    explain.add_argument("--config", metavar="FILE", help="a trainer's config to price instead of a plan folder")
    explain.add_argument("--framework", choices=FRAMEWORKS, help="the config's framework (default: recognised)")
    explain.add_argument("--model", metavar="MODEL.py", help="with --config: the model file the config trains")
    explain.add_argument("--profile", help="with --config: the profile (name or file) of the cluster")
    explain.add_argument("--devices", type=int, help="with --config: world size, where the config does not say")
    explain.add_argument("--batch", type=int, help="with --config: global batch, where the config does not say")
    add_search_arguments(explain)  # plan's --fix and --allow-*: the best plan is searched as `autoplan plan` would


def refuse_config_flags_without_config(args: argparse.Namespace) -> None:
    """``explain DIR`` re-runs the plan folder's own search: the flags that describe a config and its
    search (:func:`add_config_arguments`) would be ignored there, so they are refused in one sentence."""
    from autoplan.errors import AutoplanError

    names = ("framework", "model", "profile", "devices", "batch", "fix")
    given = [f"--{name}" for name in names if getattr(args, name)]
    given += [
        f"--{name.replace('_', '-')}" for name, value in vars(args).items() if name.startswith("allow_") and value
    ]
    if given:
        verb = "is" if len(given) == 1 else "are"
        raise AutoplanError(
            f"{', '.join(given)} {verb} for explain --config FILE; a plan folder is explained with the search "
            "it was planned with."
        )


def run_export(args: argparse.Namespace) -> int:
    from autoplan.display import duration_text
    from autoplan.export.api import export_plan, launch_for, load_plan, write_export

    if args.model:  # the model the exported config will train: the plan must be for it (trace/identity.py)
        from autoplan.trace.identity import check_plan_is_for

        warning = check_plan_is_for(load_plan(args.plan)[0], args.model, plan_name=f"plan '{args.plan}'")
        if warning and not args.quiet:
            print(f"autoplan: warning: {warning}", file=sys.stderr)
    exported = export_plan(args.plan, to=args.to, fmt=_format(args))
    fp8_line = _te_saving(args.plan) if args.to == "megatron" else ""
    path = write_export(exported, args.out)
    launch = launch_for(exported, path)  # the file just written, not the default name
    price = _runtime_price(args.plan, args.to)
    if args.json:
        priced = {"predicted": price.to_dict()} if price else {}
        print(json.dumps({"file": str(path), **exported.to_dict(), "launch": launch, **priced}, indent=2))
        return 0
    for sentence in exported.unexpressed:
        print(f"autoplan: warning: {args.to} cannot express this: {sentence}", file=sys.stderr)
    if not args.quiet:
        print(f"wrote {path}")
        if price:
            print(
                f"predicted step: {duration_text(price.runtime_step_s)} under {price.runtime} "
                f"({duration_text(price.autoplan_step_s)} under autoplan's executor)"
            )
        print(f"launch with: {launch}")
        if fp8_line:
            print(fp8_line)
    return 0


def _runtime_price(source: str, framework: str):
    """The plan priced for ``framework``'s runtime beside autoplan's executor (export/runtime_price.py),
    when the plan folder holds the graph and profile it was planned with (solve/outputs.py); None otherwise."""
    from autoplan.export.api import load_plan
    from autoplan.export.runtime_price import price_for_framework
    from autoplan.profile.io import load_profile
    from autoplan.types.plan import plan_json

    plan, graph = load_plan(source)
    profile_file = plan_json(source).parent / "profile.json"
    if graph is None or not profile_file.is_file():
        return None
    return price_for_framework(plan, graph=graph, profile=load_profile(profile_file), framework=framework)


def _te_saving(source: str) -> str:
    """For an fp8 plan folder exported to Megatron-LM, what Transformer Engine's recipe saves over
    torchao tensorwise (report/fp8.py ``te_saving``); '' without its graph or a known profile."""
    from autoplan.errors import AutoplanError
    from autoplan.export.api import load_plan
    from autoplan.profile.io import load_profile
    from autoplan.report.fp8 import te_saving

    plan, graph = load_plan(source)
    if plan.precision != "fp8" or graph is None or not plan.profile:
        return ""
    try:
        return te_saving(plan, graph=graph, profile=load_profile(plan.profile))
    except AutoplanError:
        return ""  # a profile not found here: the export itself does not need it


def _format(args: argparse.Namespace) -> str | None:
    """torchtitan's format: --format, else the --out file's suffix (.toml: 0.2.x TOML), else the default."""
    from autoplan.errors import ExportError

    suffix = (
        {".toml": "toml", ".py": "py"}.get(Path(args.out).suffix.lower())
        if args.out and args.to == "torchtitan"
        else None
    )
    if args.format and suffix and args.format != suffix:
        raise ExportError(f"--format {args.format} does not fit --out {args.out}; name the file .{args.format}.")
    return args.format or suffix


def run_explain_config(args: argparse.Namespace) -> int:
    """``autoplan explain --config FILE --model MODEL.py --profile P``."""
    from autoplan.cli.solve import search_options
    from autoplan.errors import ExportError
    from autoplan.export.api import import_config
    from autoplan.export.pricing import price_imported, pricing_lines
    from autoplan.profile.io import load_profile
    from autoplan.trace import trace_model_file

    missing = [flag for flag, value in (("--model", args.model), ("--profile", args.profile)) if not value]
    if missing:
        raise ExportError(
            f"explain --config needs {' and '.join(missing)}: the model the config trains and the cluster."
        )
    imported = import_config(args.config, framework=args.framework, devices=args.devices, batch_size=args.batch)
    graph = trace_model_file(args.model, imported.plan().global_batch_size)  # at the config's global batch
    result = price_imported(
        imported,
        graph=graph,
        profile=load_profile(args.profile),
        search=search_options(args),
        source=args.config,
        model=args.model,
    )
    if args.json:
        print(json.dumps(result.to_dict(), indent=2, default=str))
    elif not args.quiet:
        from autoplan.cli.report import print_markdown

        print_markdown("\n".join(pricing_lines(result)) + "\n")
    return 0
