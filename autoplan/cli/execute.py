"""``autoplan run MODEL.py --plan DIR/plan.json --steps S [--verify] --out RUNDIR``.

Locally it launches ``plan.devices`` processes (gloo on CPU, NCCL with CUDA). Under an
external ``torchrun`` (RANK and WORLD_SIZE already set) this process *is* one rank and runs
the job directly, so the same command works across nodes (docs/executor.md).
"""

from __future__ import annotations

import argparse
import os
import sys

from autoplan.errors import PlanError, RunError


def register(subparsers, common: argparse.ArgumentParser) -> None:
    parser = subparsers.add_parser(
        "run",
        parents=[common],
        help="run a plan with torch.distributed and measure it",
        description="Run a plan for S training steps on synthetic batches; "
        "write RUNDIR/measured.csv and RUNDIR/summary.json.",
    )
    parser.add_argument("model", help="model file (defines build_model() and example_inputs(batch_size))")
    parser.add_argument("--plan", required=True, help="a plan folder (autoplan plan --out DIR) or its plan.json")
    parser.add_argument("--steps", type=int, default=10, help="training steps (default 10)")
    parser.add_argument("--out", required=True, help="run folder to write")
    parser.add_argument(
        "--verify",
        action="store_true",
        help="compare the first steps' loss, gradients and updated weights with a single-process reference, "
        "dropout off in both (2 steps, 3 with PowerSGD; docs/executor.md)",
    )
    parser.add_argument(
        "--audit",
        action="store_true",
        help="after the timed steps, audit one step: collectives, parameters held, "
        "matmul FLOPs and peak live memory per rank beside the cost model's prediction (RUNDIR/audit.csv)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="threads per process (default: the profile's, else cores // processes)",
    )
    parser.add_argument("--timeout-s", type=float, default=45.0, help="process-group timeout in seconds (default 45)")
    add_checkpoint_arguments(parser)
    parser.set_defaults(func=run_command, out_kind="folder")
    from autoplan.cli.checkpoints import register_replan
    from autoplan.cli.launch import add_launch_parser

    register_replan(subparsers, common)
    add_launch_parser(subparsers, common)


def add_checkpoint_arguments(parser: argparse.ArgumentParser) -> None:
    """Checkpoint, resume and restart flags of ``autoplan run`` (docs/elastic.md)."""
    group = parser.add_argument_group("checkpoints and restarts (docs/elastic.md)")
    group.add_argument(
        "--checkpoint-dir",
        metavar="D",
        help="save checkpoints in D (at the end, on a stop signal, and as --checkpoint-every says)",
    )
    group.add_argument(
        "--checkpoint-every",
        type=int,
        metavar="N",
        help="save every N steps (default: the plan's Young/Daly interval when its profile has failure data, else only "
        "at the end and on a stop signal)",
    )
    group.add_argument(
        "--async-checkpoint", action="store_true", help="write checkpoints in the background while training goes on"
    )
    group.add_argument(
        "--resume", metavar="D", help="continue from the newest checkpoint in D (or the step directory D)"
    )
    group.add_argument(
        "--max-restarts",
        type=int,
        default=0,
        metavar="K",
        help="restart the job from its last checkpoint when a rank fails, up to K times (torchelastic's agent)",
    )
    group.add_argument(
        "--elastic",
        action="store_true",
        help="when the job has another number of ranks than the plan (a torchrun restart with fewer or more nodes), "
        "re-plan for it and reshard the checkpoint",
    )


def _runner_args(args: argparse.Namespace) -> list[str]:
    argv = [
        "--model",
        args.model,
        "--plan",
        args.plan,
        "--out",
        args.out,
        "--steps",
        str(args.steps),
        "--seed",
        str(args.seed),
        "--timeout-s",
        str(args.timeout_s),
    ]
    if args.threads:
        argv += ["--threads", str(args.threads)]
    for flag, value in (
        ("--checkpoint-dir", args.checkpoint_dir),
        ("--checkpoint-every", args.checkpoint_every),
        ("--resume", args.resume),
    ):
        argv += [flag, str(value)] if value is not None else []
    switches = ("verify", "audit", "async_checkpoint", "elastic")
    return argv + [f"--{name.replace('_', '-')}" for name in switches if getattr(args, name)]


def run_command(args: argparse.Namespace) -> int:
    from autoplan.execute.job import runner
    from autoplan.execute.tp_overlap import check_runs_here
    from autoplan.modelfile import load_model_file
    from autoplan.trace.identity import check_plan_is_for
    from autoplan.types.plan import Plan, plan_json

    if args.steps < 1:
        raise RunError(f"--steps {args.steps}: expected at least 1 step.")
    args.plan = str(plan_json(args.plan))  # a plan folder, or its plan.json
    plan = Plan.load(args.plan)
    _check_verify_steps(args, plan)
    check_runs_here(plan)  # a plan this machine cannot run stops before any rank starts
    model_file = load_model_file(args.model)  # fail here, once, rather than in every rank
    if (warning := check_plan_is_for(plan, model_file, plan_name=f"plan '{args.plan}'")) and not args.quiet:
        print(f"autoplan: warning: {warning}", file=sys.stderr)
    from autoplan.cli.checkpoints import check_checkpoint_arguments, stop_hint

    args.checkpoint_every = check_checkpoint_arguments(args, plan=plan, model_file=model_file)
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:  # under torchrun: we are one rank
        code = runner.main(_runner_args(args))
    else:
        _check_devices(plan.devices)
        _warn_other_device(plan)
        code = _launch(args, plan=plan, hint=stop_hint(args))
    if code == runner.EXIT_STOPPED:
        print(f"autoplan: stopped by a signal after a final checkpoint; {stop_hint(args)}.", file=sys.stderr)
    elif code == runner.EXIT_VERIFY_FAILED:
        print("autoplan: --verify found differences beyond tolerance (see the table above).", file=sys.stderr)
    elif code == 0 and not args.quiet and os.environ.get("RANK", "0") == "0":
        print(f"wrote {args.out}/measured.csv and {args.out}/summary.json")
        _print_measured_beside_predicted(args.out, plan)
    return code


def _check_verify_steps(args: argparse.Namespace, plan) -> None:
    """--verify compares the first steps up to each plan option's steady state: refuse fewer steps."""
    if not args.verify:
        return
    from autoplan.execute.job.reference import verify_steps, why_steps

    wanted = verify_steps(plan)
    if args.steps < wanted:
        raise RunError(
            f"--verify compares the first {wanted} steps of this plan ({why_steps(plan)}); "
            f"pass --steps {wanted} or more."
        )


def _launch(args: argparse.Namespace, *, plan, hint: str) -> int:
    """Local ranks: under torchelastic's agent with --max-restarts, else autoplan's launcher."""
    from autoplan.execute.job import runner
    from autoplan.execute.job.nonfinite import EXIT_NONFINITE_LOSS

    module = "autoplan.execute.job.runner"
    if args.max_restarts > 0:
        from autoplan.jobs.elastic import launch_elastic

        return launch_elastic(
            args=_runner_args(args), nprocs=plan.devices, module=module, max_restarts=args.max_restarts, hint=hint
        )
    from autoplan.jobs.launcher import launch

    return launch(
        args=_runner_args(args),
        nprocs=plan.devices,
        module=module,
        agreed_codes=(runner.EXIT_VERIFY_FAILED, runner.EXIT_STOPPED, EXIT_NONFINITE_LOSS),
        grace_s=60.0 if args.checkpoint_dir or args.resume else 5.0,  # time for a final checkpoint
        hint=hint,
    )


def _warn_other_device(plan) -> None:
    """One line when the plan was priced with a profile of another device (profile/host.py)."""
    from autoplan.errors import AutoplanError
    from autoplan.profile import load_profile
    from autoplan.profile.host import device_mismatch

    try:
        profile = load_profile(plan.profile) if plan.profile else None
    except AutoplanError:
        return
    if profile and (warning := device_mismatch(profile, running=True)):
        print(f"autoplan: warning: {warning}", file=sys.stderr)


def _print_measured_beside_predicted(out: str, plan) -> None:
    import json
    from pathlib import Path

    from autoplan.profile.host import measured_beside_predicted

    summary = json.loads((Path(out) / "summary.json").read_text())
    for line in measured_beside_predicted(
        measured_s=summary.get("median_step_time_s"),
        predicted_s=summary.get("predicted_step_time_s"),
        profile_name=plan.profile or "PROFILE",
        run_dir=out,
    ):
        print(line)


def _check_devices(devices: int) -> None:
    import torch

    if torch.cuda.is_available() and torch.cuda.device_count() < devices:
        raise PlanError(
            f"the plan needs {devices} GPUs but this machine has {torch.cuda.device_count()}; "
            "run it under torchrun across nodes (docs/executor.md)."
        )
