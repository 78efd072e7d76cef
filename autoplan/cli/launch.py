"""``autoplan launch MODEL.py PLAN --slurm | --skypilot | --torchx``: a file that runs the plan on a cluster.

Registered by the execute stage's command module (autoplan/cli/execute.py), beside ``autoplan
run``: the file it writes runs ``autoplan run`` on every node under torchrun (docs/launch.md).
The nodes: ``devices / G`` of them, G from ``--gpus-per-node`` or else the plan's profile
(``devices_per_node``). Slurm gets absolute paths (a shared file system); SkyPilot and TorchX get
paths relative to this folder, which SkyPilot syncs and a TorchX image is built from. The file
sets the model's size variables (every ``AUTOPLAN_*`` variable set here but autoplan's own run
controls: the sizes the plan's graph signature was just checked under). Bad input (no plan,
another model's plan, devices that are not whole nodes, not exactly one target, TorchX retries
without a checkpoint volume) is one sentence, exit 2.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from autoplan.errors import RunError
from autoplan.types.run_options import add_run_arguments, check_steps

#: a launched job trains for real on a cluster: 1,000 steps unless told (a local `autoplan run` checks a plan in 10)
LAUNCHED_STEPS = 1000
TARGETS = {"slurm": ("launch.sbatch", "sbatch {file}"), "skypilot": ("sky.yaml", "sky launch {file}")}
TARGETS["torchx"] = ("torchx_job.py", "torchx run --scheduler kubernetes --scheduler_args queue=default {file}:train")


def add_launch_parser(subparsers, common: argparse.ArgumentParser) -> None:
    """``autoplan launch``: called by autoplan/cli/execute.py's register."""
    parser = subparsers.add_parser(
        "launch",
        parents=[common],
        help="write a Slurm script, SkyPilot task or TorchX component that runs a plan on many nodes",
        description="Write a file that runs `autoplan run MODEL --plan PLAN` under one torchrun per node "
        "(docs/launch.md), and print the command that submits it.",
    )
    parser.add_argument("model", help="model file (as for `autoplan run`)")
    parser.add_argument("plan", help="a plan folder (autoplan plan --out DIR) or its plan.json")
    target = parser.add_argument_group("target (exactly one)")
    target.add_argument("--slurm", action="store_true", help="an sbatch script (submit: sbatch FILE)")
    target.add_argument("--skypilot", action="store_true", help="a SkyPilot task YAML (submit: sky launch FILE)")
    target.add_argument("--torchx", action="store_true", help="a TorchX component for Kubernetes (torchx run)")
    nodes = parser.add_argument_group("nodes")
    nodes.add_argument("--gpus-per-node", type=int, metavar="G", help="ranks per node (default: the profile's)")
    nodes.add_argument("--cpus-per-node", type=int, metavar="C", help="CPU cores per node (default 8 per rank)")
    nodes.add_argument("--accelerator", help="cloud GPU name, e.g. H100 (default: from the profile's device)")
    nodes.add_argument("--rdzv-port", type=int, default=29500, help="rendezvous port on the first node (29500)")
    parser.add_argument("--partition", metavar="P", help="Slurm partition")
    parser.add_argument("--time", default="24:00:00", metavar="HH:MM:SS", help="Slurm time limit (24:00:00)")
    parser.add_argument("--setup", help="SkyPilot setup command (default: install this checkout on each node)")
    parser.add_argument("--image", default="IMAGE", help="TorchX container image with autoplan, model and plan")
    parser.add_argument(
        "--checkpoint-volume",
        metavar="V",
        help="TorchX: a PersistentVolumeClaim (or absolute host path) every replica mounts at /checkpoints",
    )
    parser.add_argument(
        "--max-retries", type=int, default=3, metavar="N", help="TorchX whole-job restarts (3; needs a volume)"
    )
    parser.add_argument("--run-dir", metavar="D", help="the run folder (default: RUN beside the plan)")
    parser.add_argument(
        "--checkpoint-dir",
        metavar="D",
        help="shared checkpoint folder; a restart resumes from it (default: beside the plan)",
    )
    add_run_arguments(parser, only=("steps", "checkpoint_every"), defaults={"steps": LAUNCHED_STEPS})
    parser.add_argument("--out", metavar="FILE", help="file to write (default: beside the plan)")
    parser.set_defaults(func=launch_command, out_kind="file")


def launch_command(args: argparse.Namespace) -> int:
    from autoplan.types._check import write_text_atomic
    from autoplan.types.moe_overlap import check_executor_runs
    from autoplan.types.plan import plan_json
    from autoplan.types.runtime import check_runs_on_autoplan

    target = _target(args)
    args.plan = str(plan_json(args.plan))
    plan = _plan(args.plan)
    check_runs_on_autoplan(plan.runtime)  # the job runs autoplan's executor
    check_executor_runs(plan)  # which overlaps the EP all-to-all only in DualPipeV (types/moe_overlap.py)
    if not Path(args.model).is_file():
        raise RunError(f"model file '{args.model}' does not exist.")
    _check_model(args, plan)
    check_steps(steps=args.steps, checkpoint_every=args.checkpoint_every)
    out = Path(args.out or Path(args.plan).parent / TARGETS[target][0])
    job = _job(args, plan=plan, target=target)
    text, notes = _render(args, job=job, target=target, out=out, plan=plan)
    write_text_atomic(out, text)
    _report(args, job=job, out=out, submit=TARGETS[target][1].format(file=out), plan=plan, notes=notes)
    return 0


def _report(args: argparse.Namespace, *, job, out: Path, submit: str, plan, notes: dict) -> None:
    """What was written, each assumption the file makes (``notes``: one sentence each), and how to submit it."""
    if args.json:
        import json

        fields = {"file": str(out), "nodes": job.nodes, "gpus_per_node": job.gpus_per_node, "submit": submit}
        print(json.dumps({**fields, "environment": dict(job.environment), **notes}))
    elif not args.quiet:
        print(f"wrote {out}: {job.nodes} node(s) x {job.gpus_per_node} rank(s), {plan.describe()}")
        if job.environment:
            sizes = " ".join(f"{name}={value}" for name, value in job.environment)
            checked = (
                "checked against the plan's graph signature" if plan.graph_signature else "the plan has none to check"
            )
            print(f"the ranks build the model with {sizes} (set here; {checked})")
        for note in notes.get("assumptions", []):
            print(note)
        print(f"submit with: {submit}")


def _check_model(args: argparse.Namespace, plan) -> None:
    """Refuse a model the plan was not made for; warn when only its file changed (trace/identity.py)."""
    import sys

    from autoplan.trace.identity import check_plan_is_for

    if (warning := check_plan_is_for(plan, args.model, plan_name=f"plan '{args.plan}'")) and not args.quiet:
        print(f"autoplan: warning: {warning}", file=sys.stderr)


def _target(args: argparse.Namespace) -> str:
    chosen = [name for name in TARGETS if getattr(args, name)]
    if len(chosen) != 1:
        raise RunError(f"give exactly one of --slurm, --skypilot and --torchx, not {len(chosen)}.")
    if args.checkpoint_volume and chosen[0] != "torchx":
        raise RunError("--checkpoint-volume is for --torchx; a Slurm or SkyPilot job names a shared --checkpoint-dir.")
    if args.checkpoint_volume and args.checkpoint_dir:
        raise RunError(
            "with --checkpoint-volume the checkpoint folder is that volume, mounted at /checkpoints; "
            "drop --checkpoint-dir."
        )
    return chosen[0]


def _plan(path: str):
    from autoplan.errors import PlanError
    from autoplan.types.plan import Plan

    if not Path(path).is_file():
        raise PlanError(
            f"plan '{path}' is neither a plan.json nor a plan folder; write one with `autoplan plan --out DIR`."
        )
    return Plan.load(path)


def _job(args: argparse.Namespace, *, plan, target: str):
    from autoplan.jobs.cloud import accelerator_name
    from autoplan.jobs.nodejob import NodeJob, executor_args, job_name

    profile = _profile(plan, needed=args.gpus_per_node is None)
    absolute = target == "slurm"
    run_dir = args.run_dir or str(Path(args.plan).parent / "run")
    return NodeJob(
        name=job_name(Path(args.model).stem),
        devices=plan.devices,
        gpus_per_node=args.gpus_per_node or profile.devices_per_node,
        executor_args=executor_args(
            model=_path(args.model, absolute=absolute),
            plan=_path(args.plan, absolute=absolute),
            steps=args.steps,
            run_dir=_path(run_dir, absolute=absolute, exists=False),
            checkpoint_dir=_checkpoint_dir(args, absolute=absolute),
            checkpoint_every=args.checkpoint_every,
        ),
        uses_gpus=profile is None or profile.backend == "nccl" or bool(args.accelerator),
        accelerator=args.accelerator or (accelerator_name(profile.device.name) if profile else None),
        rdzv_port=args.rdzv_port,
        environment=model_environment(),
    )


def _checkpoint_dir(args: argparse.Namespace, *, absolute: bool) -> str:
    """--checkpoint-dir as the nodes see it; a TorchX volume's mount point when one is given."""
    from autoplan.jobs.cloud import TORCHX_CHECKPOINTS

    if args.checkpoint_volume:
        return TORCHX_CHECKPOINTS
    checkpoint_dir = args.checkpoint_dir or str(Path(args.plan).parent / "checkpoints")
    return _path(checkpoint_dir, absolute=absolute, exists=False)


def model_environment() -> tuple[tuple[str, str], ...]:
    """The ``AUTOPLAN_*`` variables set here, which model files read their sizes from (examples/*.py),
    less autoplan's own run controls (error folder, launcher pid, fault injection, FP8 emulation, the trace
    cache's and the search cache's folders, the heartbeat's folder, the search's processes)."""
    import os

    from autoplan.cost import stored
    from autoplan.execute.float8 import EMULATE_ENV
    from autoplan.execute.job.checkpointing import FAULT_ENV
    from autoplan.jobs.heartbeat import HEARTBEAT_DIR_ENV
    from autoplan.jobs.lifeline import LAUNCHER_PID_ENV
    from autoplan.solve.shares import JOBS_ENV
    from autoplan.trace.cache import ENV_VAR as TRACE_CACHE_ENV

    controls = {"AUTOPLAN_ERROR_DIR", LAUNCHER_PID_ENV, FAULT_ENV, EMULATE_ENV, TRACE_CACHE_ENV, HEARTBEAT_DIR_ENV}
    controls |= {JOBS_ENV, stored.ENV_VAR}
    return tuple(
        (name, value)
        for name, value in sorted(os.environ.items())
        if name.startswith("AUTOPLAN_") and name not in controls
    )


def _profile(plan, *, needed: bool):
    """The plan's profile; None when it cannot be read and --gpus-per-node makes it unneeded."""
    from autoplan.errors import AutoplanError
    from autoplan.profile import load_profile

    try:
        if not plan.profile:
            raise RunError("the plan names no profile")
        return load_profile(plan.profile)
    except AutoplanError as exc:
        if not needed:
            return None
        raise RunError(
            f"cannot tell the devices per node from the plan's profile ({str(exc).rstrip('.')}); "
            "pass --gpus-per-node G."
        ) from None


def _path(path: str, *, absolute: bool, exists: bool = True) -> str:
    """Absolute for Slurm; else relative to this folder, which the cloud copies (module docstring)."""
    resolved = Path(path).resolve()
    if absolute:
        return str(resolved)
    try:
        return resolved.relative_to(Path.cwd().resolve()).as_posix()
    except ValueError:
        what = "file" if exists else "folder"
        raise RunError(
            f"{what} '{path}' is outside this folder, which SkyPilot and TorchX copy to the nodes; "
            "run `autoplan launch` from a folder that holds it."
        ) from None


def _render(args: argparse.Namespace, *, job, target: str, out: Path, plan) -> tuple[str, dict]:
    """The file's text, and what it assumed (printed by :func:`_report`)."""
    header = (
        f"Written by `autoplan launch` for {args.plan} ({plan.describe()}): "
        f"{job.nodes} node(s) x {job.gpus_per_node} rank(s).\nSubmit with: {TARGETS[target][1].format(file=out)}"
    )
    if plan.graph_signature:
        header += f"\nModel: {Path(args.model).name} (graph signature {plan.graph_signature})."
    if target == "slurm":
        return _render_slurm(args, job=job, out=out, plan=plan, header=header)
    from autoplan.jobs.cloud import skypilot_task, torchx_component

    if target == "skypilot":
        return skypilot_task(job, install=_node_install(args), header=header), {}
    cpus = args.cpus_per_node or 8 * job.gpus_per_node
    text = torchx_component(
        job,
        image=args.image,
        cpus_per_node=cpus,
        memory_mb_per_node=16384 * job.gpus_per_node,
        max_retries=args.max_retries,
        checkpoint_volume=args.checkpoint_volume,
    )
    return text, {}


def _render_slurm(args: argparse.Namespace, *, job, out: Path, plan, header: str) -> tuple[str, dict]:
    from autoplan.jobs.slurm import sbatch_script, stop_times

    predicted = plan.predicted
    stop = stop_times(
        step_time_s=predicted.step_time_s if predicted else None,
        checkpoint_write_s=predicted.checkpoint_write_s if predicted else None,
    )
    text = sbatch_script(
        job,
        time_limit=args.time,
        output=str(out.resolve().parent / f"{job.name}-%j.out"),
        stop=stop,
        partition=args.partition,
        cpus_per_node=args.cpus_per_node,
        header=header,
        shutdown_flag=(flag := torchrun_has_shutdown_timeout()),
    )
    waits = (
        f"waits up to {stop.shutdown_timeout_s} s" if flag else "(this torch's, without --shutdown-timeout) waits 30 s"
    )
    note = (
        f"at the time limit: the ranks get SIGTERM {stop.signal_lead_s} s before it and torchrun {waits} "
        f"for their final checkpoint ({stop.basis}), then the job requeues itself"
    )
    fields = {"shutdown_timeout_s": stop.shutdown_timeout_s if flag else None, "signal_lead_s": stop.signal_lead_s}
    return text, {"assumptions": [note], **fields}


def torchrun_has_shutdown_timeout() -> bool:
    """Whether this torch's torchrun accepts ``--shutdown-timeout`` (pytorch/pytorch#172596); an older
    one would end the job at once on the unknown flag, and gives the ranks its fixed 30 s."""
    from torch.distributed.run import get_args_parser

    return any("--shutdown-timeout" in action.option_strings for action in get_args_parser()._actions)


def _node_install(args: argparse.Namespace):
    """SkyPilot's setup: --setup as given, else this checkout (autoplan/jobs/install.py)."""
    from autoplan.jobs.install import NodeInstall, checkout_root, node_install

    if args.setup:
        return NodeInstall(setup=args.setup)
    return node_install(checkout=checkout_root(), workdir=Path.cwd())
