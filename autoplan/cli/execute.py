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
    parser.add_argument("--plan", required=True, help="plan.json written by `autoplan plan`")
    parser.add_argument("--steps", type=int, default=10, help="training steps (default 10)")
    parser.add_argument("--out", required=True, help="run folder to write")
    parser.add_argument(
        "--verify", action="store_true", help="compare step 1's loss and gradients to a single-process reference"
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
    parser.set_defaults(func=run_command)


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
    return argv + (["--verify"] if args.verify else []) + (["--audit"] if args.audit else [])


def run_command(args: argparse.Namespace) -> int:
    from autoplan.execute.job import runner
    from autoplan.execute.tp_overlap import check_runs_here
    from autoplan.modelfile import load_model_file
    from autoplan.types.plan import Plan

    if args.steps < 1:
        raise RunError(f"--steps {args.steps}: expected at least 1 step.")
    plan = Plan.load(args.plan)
    check_runs_here(plan)  # a plan this machine cannot run stops before any rank starts
    load_model_file(args.model)  # fail here, once, rather than in every rank
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:  # under torchrun: we are one rank
        code = runner.main(_runner_args(args))
    else:
        _check_devices(plan.devices)
        _warn_other_device(plan)
        from autoplan.jobs.launcher import launch

        code = launch(
            args=_runner_args(args),
            nprocs=plan.devices,
            module="autoplan.execute.job.runner",
            agreed_codes=(runner.EXIT_VERIFY_FAILED,),
        )
    if code == runner.EXIT_VERIFY_FAILED:
        print("autoplan: --verify found differences beyond tolerance (see the table above).", file=sys.stderr)
    elif code == 0 and not args.quiet and os.environ.get("RANK", "0") == "0":
        print(f"wrote {args.out}/measured.csv and {args.out}/summary.json")
        _print_measured_beside_predicted(args.out, plan)
    return code


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
