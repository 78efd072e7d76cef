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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autoplan.errors import CheckpointError, RunError
from autoplan.types.plan import Plan
from autoplan.types.run_options import RunOptions


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


@dataclass
class Replanned:
    """A plan search for another device count from a checkpoint: the search ``result`` (``.best``
    is the plan), the ``graph`` and ``profile`` it searched, and the checkpoint it started from."""

    result: Any
    graph: Any
    profile: Any
    step_dir: Path
    info: Any
    model_file: Path

    @property
    def best(self) -> Plan:
        return self.result.best


def replan(
    checkpoint: str | Path, *, devices: int, profile: Any = None, model: str | Path | None = None, **options: Any
) -> Replanned:
    """The best plan for ``devices`` devices from the plan and model file ``checkpoint`` records,
    with the same global batch (autoplan/solve/replan.py), on the profile the old plan was priced
    with unless another is given; ``model`` overrides the model file the checkpoint records (it moved)."""
    from autoplan.execute.checkpoint import store
    from autoplan.solve.replan import search

    step_dir = store.find_checkpoint(checkpoint)
    info = store.read_info(step_dir)
    model_file = Path(model) if model else Path(info.model_file)
    if not model_file.is_file():
        raise CheckpointError(
            f"checkpoint '{step_dir}' was written for model file '{info.model_file}', which does not exist here; "
            "pass the model file with --model."
        )
    result, graph, resolved = search(
        model=model_file, plan=Plan.from_dict(info.plan), devices=devices, profile=profile, **options
    )
    return Replanned(result, graph, resolved, step_dir, info, model_file)


def replan_command(args: argparse.Namespace) -> int:
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
    return Plan.from_dict(plan).describe()


def check_checkpoint_arguments(opts: RunOptions, *, plan, model_file, quiet: bool) -> int | None:
    """Refuse bad checkpoint flags (module docstring; the counts are checked by RunOptions itself);
    the --checkpoint-every to use."""
    from autoplan.execute.checkpoint import store

    every = opts.checkpoint_every
    wants_dir = every is not None or opts.async_checkpoint or opts.max_restarts > 0 or opts.elastic
    if wants_dir and not (opts.checkpoint_dir or opts.resume):
        raise RunError(
            "--checkpoint-every, --async-checkpoint, --max-restarts and --elastic need --checkpoint-dir D "
            "(where the run saves, and restarts from)."
        )
    source = opts.resume
    if source is None and opts.checkpoint_dir and store.complete_checkpoints(Path(opts.checkpoint_dir)):
        source = opts.checkpoint_dir  # resumed by itself (autoplan/execute/job/checkpointing.py)
    if source is not None:
        _check_resume(opts, source=source, model_file=model_file, quiet=quiet)
    return every if every is not None else _young_daly_steps(plan)


def _check_resume(opts: RunOptions, *, source: str, model_file, quiet: bool) -> None:
    from autoplan.execute.checkpoint import store
    from autoplan.execute.job.checkpointing import check_resumable

    step_dir, info = store.check(source, expected=store.model_shapes(model_file))
    check_resumable(info, source=step_dir, steps=opts.steps, verify=opts.verify)
    if quiet or os.environ.get("RANK", "0") != "0":  # under torchrun every rank checks; one says so
        return
    if not opts.resume:
        print(
            f"autoplan: --checkpoint-dir {opts.checkpoint_dir} holds {step_dir.name}: resuming from it "
            "(a new directory starts over).",
            file=sys.stderr,
        )
    if info.model_sha256 and info.model_sha256 != store.model_sha256(opts.model):
        print(
            f"autoplan: warning: {opts.model} has changed since checkpoint '{step_dir}' was written; "
            "its tensors still match the model.",
            file=sys.stderr,
        )


def _young_daly_steps(plan) -> int | None:
    """The plan's priced checkpoint interval in steps, when its profile had failure data."""
    steps = getattr(plan.predicted, "checkpoint_every_steps", None) if plan.predicted else None
    return int(steps) if steps else None


def stop_hint(opts: RunOptions) -> str:
    """The end of a stop signal's message: where to resume from."""
    folder = opts.checkpoint_dir or opts.resume
    if not folder:
        return ""
    return f"the last checkpoint is in {folder}: continue with --resume {folder}"
