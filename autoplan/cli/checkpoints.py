"""``autoplan replan CHECKPOINT --devices N --out DIR`` (registered by the execute stage's
command module, autoplan/cli/execute.py), and the checks ``autoplan run`` makes on
its checkpoint flags before any rank starts (docs/elastic.md).

Checked once here, in one sentence each (exit 2): a --resume that names no complete checkpoint,
a corrupt one, one from another checkpoint format, one of another model (the first tensor whose
name or shape differs), one already at --steps; --max-restarts without a checkpoint directory to
restart from. A --checkpoint-dir that already holds checkpoints is resumed from, said in one
line, and checked the same way: never a silent start from step 0 over them.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from autoplan.errors import RunError


def register_replan(subparsers, common: argparse.ArgumentParser) -> None:
    """``autoplan replan``, registered with ``autoplan run`` by autoplan/cli/execute.py (both run plans)."""
    parser = subparsers.add_parser(
        "replan",
        parents=[common],
        help="plan for another device count from a checkpoint, keeping its global batch",
        description="Read the plan and model a checkpoint records, search the best plan for N devices with the "
        "same global batch, and write DIR/plan.json; `autoplan run --resume` then reshards the checkpoint into it.",
    )
    parser.add_argument("checkpoint", help="a checkpoint directory (its newest checkpoint) or one step directory")
    parser.add_argument("--devices", type=int, required=True, help="number of devices to continue on")
    parser.add_argument(
        "--profile", help="profile name or file (default: the one the checkpoint's plan was priced with)"
    )
    parser.add_argument("--model", help="the model file, when it moved since the checkpoint was written")
    parser.add_argument(
        "--allow-fp8",
        action="store_true",
        help="also consider FP8 linears (default: only when the checkpoint's plan was FP8 or searched FP8)",
    )
    parser.add_argument("--out", required=True, metavar="DIR", help="output folder for plan.json and the plan tables")
    parser.set_defaults(func=replan_command, out_kind="folder")


def replan_command(args: argparse.Namespace) -> int:
    from autoplan.execute.checkpoint.replan import replan
    from autoplan.solve.outputs import write_outputs

    if args.devices < 1:
        raise RunError(f"--devices {args.devices}: expected at least 1 device.")
    found = replan(
        args.checkpoint, devices=args.devices, profile=args.profile, model=args.model, allow_fp8=args.allow_fp8 or None
    )
    best, step_dir = found.best, found.step_dir
    paths = write_outputs(args.out, result=found.result, graph=found.graph, profile=found.profile)
    if args.json:
        import json

        print(json.dumps({"plan": best.to_dict(), "checkpoint": str(step_dir)}, indent=2, default=str))
    elif not args.quiet:
        print(f"checkpoint {step_dir} (step {found.info.step}) was trained with: {_describe(found.info.plan)}")
        print(f"best for {args.devices} devices: {best.describe()}  ->  {paths['plan.json']}")
        print(
            f"continue with: autoplan run {found.model_file} --plan {paths['plan.json']} "
            f"--resume {args.checkpoint} --steps S"
        )
    return 0


def _describe(plan: dict) -> str:
    from autoplan.types.plan import Plan

    return Plan.from_dict(plan).describe()


def check_checkpoint_arguments(args: argparse.Namespace, *, plan, model_file) -> int | None:
    """Refuse bad checkpoint flags (module docstring); the --checkpoint-every to use."""
    from autoplan.execute.checkpoint import store

    every = args.checkpoint_every
    if every is not None and every < 1:
        raise RunError(f"--checkpoint-every {every}: expected at least 1 step.")
    if args.max_restarts < 0:
        raise RunError(f"--max-restarts {args.max_restarts}: expected 0 or more.")
    wants_dir = every is not None or args.async_checkpoint or args.max_restarts > 0 or args.elastic
    if wants_dir and not (args.checkpoint_dir or args.resume):
        raise RunError(
            "--checkpoint-every, --async-checkpoint, --max-restarts and --elastic need --checkpoint-dir D "
            "(where the run saves, and restarts from)."
        )
    source = args.resume
    if source is None and args.checkpoint_dir and store.complete_checkpoints(Path(args.checkpoint_dir)):
        source = args.checkpoint_dir  # resumed by itself (autoplan/execute/job/checkpointing.py)
    if source is not None:
        _check_resume(args, source=source, model_file=model_file)
    return every if every is not None else _young_daly_steps(plan)


def _check_resume(args: argparse.Namespace, *, source: str, model_file) -> None:
    from autoplan.execute.checkpoint import store
    from autoplan.execute.job.checkpointing import check_resumable

    step_dir, info = store.check(source, expected=store.model_shapes(model_file))
    check_resumable(info, source=step_dir, steps=args.steps, verify=args.verify)
    if args.quiet or os.environ.get("RANK", "0") != "0":  # under torchrun every rank checks; one says so
        return
    if not args.resume:
        print(
            f"autoplan: --checkpoint-dir {args.checkpoint_dir} holds {step_dir.name}: resuming from it "
            "(a new directory starts over).",
            file=sys.stderr,
        )
    if info.model_sha256 and info.model_sha256 != store.model_sha256(args.model):
        print(
            f"autoplan: warning: {args.model} has changed since checkpoint '{step_dir}' was written; "
            "its tensors still match the model.",
            file=sys.stderr,
        )


def _young_daly_steps(plan) -> int | None:
    """The plan's priced checkpoint interval in steps, when its profile had failure data."""
    steps = getattr(plan.predicted, "checkpoint_every_steps", None) if plan.predicted else None
    return int(steps) if steps else None


def stop_hint(args: argparse.Namespace) -> str:
    """The end of a stop signal's message: where to resume from."""
    folder = args.checkpoint_dir or args.resume
    if not folder:
        return ""
    return f"the last checkpoint is in {folder}: continue with --resume {folder}"
