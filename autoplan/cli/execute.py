"""``autoplan run MODEL.py --plan DIR/plan.json --steps S [--verify] --out RUNDIR``.

Locally it launches ``plan.devices`` processes (gloo on CPU, NCCL with CUDA). Under an
external ``torchrun`` (RANK and WORLD_SIZE already set) this process *is* one rank and runs
the job directly, so the same command works across nodes (docs/executor.md).
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import replace

from autoplan.errors import PlanError, RunError
from autoplan.types.run_options import RunOptions, add_run_arguments


def register(subparsers, common: argparse.ArgumentParser) -> None:
    parser = subparsers.add_parser(
        "run",
        parents=[common],
        help="run a plan with torch.distributed and measure it",
        description="Run a plan for S training steps on synthetic batches; "
        "write RUNDIR/measured.csv and RUNDIR/summary.json.",
    )
    add_run_arguments(parser)
    parser.set_defaults(func=run_command, out_kind="folder")
    from autoplan.cli.checkpoints import register_replan
    from autoplan.cli.launch import add_launch_parser

    register_replan(subparsers, common)
    add_launch_parser(subparsers, common)


def run_command(args: argparse.Namespace) -> int:
    from autoplan.cli.rank import profile_threads, run_rank, write_audit_prediction
    from autoplan.execute.job import contract
    from autoplan.execute.tp_overlap import check_runs_here
    from autoplan.modelfile import load_model_file
    from autoplan.trace.identity import check_plan_is_for
    from autoplan.types.plan import Plan, plan_json
    from autoplan.types.runtime import check_runs_on_autoplan

    may_fork = _one_thread_until_launch(args)  # before the model file's import can start a thread pool
    opts = RunOptions.from_namespace(args)
    opts = replace(opts, plan=str(plan_json(opts.plan)))  # a plan folder, or its plan.json
    plan = Plan.load(opts.plan)
    check_runs_on_autoplan(plan.runtime)  # a plan priced for Megatron, torchtitan or DeepSpeed is for export
    _check_verify_steps(opts, plan)
    check_runs_here(plan)  # a plan this machine cannot run stops before any rank starts
    model_file = load_model_file(opts.model)  # fail here, once, rather than in every rank
    if (warning := check_plan_is_for(plan, model_file, plan_name=f"plan '{opts.plan}'")) and not args.quiet:
        print(f"autoplan: warning: {warning}", file=sys.stderr)
    from autoplan.execute.sparse_grads import check_model_file

    check_model_file(model_file, plan)  # sparse embedding gradients run only under DDP
    from autoplan.cli.checkpoints import check_checkpoint_arguments, stop_hint

    every = check_checkpoint_arguments(opts, plan=plan, model_file=model_file, quiet=args.quiet)
    opts = replace(opts, checkpoint_every=every, profile_threads=profile_threads(plan))
    if opts.audit and os.environ.get("RANK", "0") == "0":  # the prediction rank 0 writes audit.csv beside
        write_audit_prediction(opts, plan)
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:  # under torchrun: we are one rank
        code = run_rank(opts)
        args.exits_fast = True  # no interpreter teardown once done, as a forked rank (execute/job/runner.py exit_now)
    else:
        _check_devices(plan.devices)
        _warn_other_device(plan)
        code = _launch(opts, plan=plan, hint=stop_hint(opts), fork=may_fork and _on_cpu())
    if code == contract.EXIT_STOPPED:
        print(f"autoplan: stopped by a signal after a final checkpoint; {stop_hint(opts)}.", file=sys.stderr)
    elif code == contract.EXIT_VERIFY_FAILED:
        print("autoplan: --verify found differences beyond tolerance (see the table above).", file=sys.stderr)
    elif code == 0 and not args.quiet and os.environ.get("RANK", "0") == "0":
        print(f"wrote {opts.out}/measured.csv and {opts.out}/summary.json")
        _print_measured_beside_predicted(opts.out, plan)
    return code


def _check_verify_steps(opts: RunOptions, plan) -> None:
    """--verify compares the first steps up to each plan option's steady state: refuse fewer steps."""
    if not opts.verify:
        return
    from autoplan.execute.job.contract import verify_steps, why_steps

    wanted = verify_steps(plan)
    if opts.steps < wanted:
        raise RunError(
            f"--verify compares the first {wanted} steps of this plan ({why_steps(plan)}); "
            f"pass --steps {wanted} or more."
        )


def _one_thread_until_launch(args: argparse.Namespace) -> bool:
    """Whether the local ranks may be forked from this process (autoplan/jobs/forked.py): it is the
    ``autoplan`` program's own (a caller that runs the CLI in its process may have started OpenMP's pool),
    and not a torchrun rank; then it keeps torch to one intra-op thread, which starts no pool, until it
    forks. The ranks set their own threads (autoplan/execute/job/runner.py ``rank_threads``)."""
    if not getattr(args, "own_process", False) or "RANK" in os.environ:
        return False
    import torch

    torch.set_num_threads(1)
    return True


def _on_cpu() -> bool:
    """Linux without a CUDA device: a rank forked after the launcher asked CUDA for its devices could not
    use them, and macOS's system libraries are not safe to use in a forked child."""
    import torch

    return sys.platform.startswith("linux") and not torch.cuda.is_available()


def _launch(opts: RunOptions, *, plan, hint: str, fork: bool = False) -> int:
    """Local ranks (``python -m autoplan.cli.rank OPTIONS``, autoplan/cli/rank.py, or forked from this
    process when ``fork``): under torchelastic's agent with --max-restarts, else autoplan's launcher."""
    from autoplan.execute.job.contract import AGREED_EXITS

    module, args = "autoplan.cli.rank", [opts.to_json()]
    if opts.max_restarts > 0:
        from autoplan.jobs.elastic import launch_elastic

        return launch_elastic(args=args, nprocs=plan.devices, module=module, max_restarts=opts.max_restarts, hint=hint)
    from autoplan.jobs.hang import Deadlines
    from autoplan.jobs.launcher import launch

    if fork:
        _import_rank_modules(opts)
    return launch(
        args=args,
        nprocs=plan.devices,
        module=module,
        agreed_codes=AGREED_EXITS,
        grace_s=60.0 if opts.checkpoint_dir or opts.resume else 5.0,  # time for a final checkpoint
        hint=hint,
        fork=fork,
        hang=Deadlines.for_plan(plan, floor_s=opts.hang_timeout_s, timeout_s=opts.timeout_s),  # the heartbeat's
    )


#: what every local rank imports to run its part (autoplan/cli/rank.py: the runner, the executor's appliers)
RANK_MODULES = ("autoplan.execute.job.runner", "autoplan.execute.api")


def _import_rank_modules(opts: RunOptions) -> None:
    """Import what each rank will import (:data:`RANK_MODULES`, --verify's reference, --audit's recorders) in
    this process before it forks the ranks (autoplan/jobs/forked.py): each rank starts with them, where each
    imported them again, ~1 s of CPU a rank (a 2-rank CPU run 4.3 -> 3.1 s user+sys CPU in all, alternating
    runs on the 2-core dev machine). No thread starts: DTensor, FSDP2, dynamo and pipelining import none."""
    import importlib

    names = list(RANK_MODULES)
    if opts.verify:
        names.append("autoplan.execute.job.reference")
    if opts.audit:
        names.append("autoplan.execute.job.audit")
    for name in names:
        importlib.import_module(name)


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
