"""A Slurm batch script for a :class:`~autoplan.jobs.nodejob.NodeJob`: ``sbatch FILE`` runs the plan.

The script asks for ``nodes`` nodes with one task each (``--ntasks-per-node=1``): that task is
torchrun's agent, which starts the node's ``gpus_per_node`` ranks. ``srun`` runs the agent once
per node; the agents meet in a c10d rendezvous hosted on the job's first node
(``scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1``), keyed by ``$SLURM_JOB_ID``, and
number the ranks among themselves, so no node rank is passed. ``--kill-on-bad-exit=1`` ends every
node when one fails, rather than leaving the others to time out on a collective.

Restarts: ``--requeue`` lets Slurm put the job back in the queue after a node failure or a
preemption; the requeued job runs the same script, and ``autoplan run --checkpoint-dir D``
resumes from the newest complete checkpoint in D by itself (autoplan/cli/checkpoints.py), so D
must be on storage every node shares. ``--signal=TERM@S`` sends SIGTERM to the job step S seconds
before the time limit: the ranks write a final checkpoint (docs/elastic.md) and the next job
(or a requeue) continues from it. ``--open-mode=append`` keeps the log of every attempt.
"""

from __future__ import annotations

import re

from autoplan.errors import RunError
from autoplan.jobs.nodejob import NodeJob

#: Seconds before the time limit at which the ranks get SIGTERM and write a final checkpoint.
DEFAULT_SIGNAL_S = 120
#: CPU cores asked per node when no --cpus-per-node is given: 8 per rank, a common GPU node's share.
CPUS_PER_RANK = 8
#: A shell line continuation and the indent of an argument of the per-node command.
CONTINUATION = "\\\n        "


def sbatch_script(
    job: NodeJob,
    *,
    time_limit: str,
    output: str,
    partition: str | None = None,
    cpus_per_node: int | None = None,
    signal_s: int = DEFAULT_SIGNAL_S,
    header: str = "",
) -> str:
    """The batch script (module docstring); ``output`` is the log path (``%j`` = job id), in a
    folder that exists when the job starts (Slurm does not create it)."""
    _check_time(time_limit)
    cpus = cpus_per_node or CPUS_PER_RANK * job.gpus_per_node
    if cpus < 1:
        raise RunError(f"--cpus-per-node {cpus}: expected at least 1 core.")
    lines = ["#!/bin/bash", *(f"# {line}" for line in header.splitlines())]
    lines += [f"#SBATCH {option}" for option in _options(job, time_limit, output, partition, cpus, signal_s)]
    lines += ["", "set -eu  # no pipefail: `head -n 1` may close scontrol's pipe early, which is no error", *_body(job)]
    return "\n".join(lines) + "\n"


def _options(job: NodeJob, time_limit: str, output: str, partition: str | None, cpus: int, signal_s: int) -> list[str]:
    options = [f"--job-name={job.name}", f"--nodes={job.nodes}", "--ntasks-per-node=1"]
    if job.uses_gpus:
        options.append(f"--gpus-per-node={job.gpus_per_node}")
    options += [f"--cpus-per-task={cpus}", f"--time={time_limit}"]
    if partition:
        options.append(f"--partition={partition}")
    return options + [f"--output={output}", "--open-mode=append", "--requeue", f"--signal=TERM@{signal_s}"]


def _body(job: NodeJob) -> list[str]:
    return [
        "",
        "# the c10d rendezvous store runs on the job's first node",
        'HEAD=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
        'echo "autoplan: job $SLURM_JOB_ID on $SLURM_NNODES nodes, rendezvous at $HEAD:'
        f'{job.rdzv_port}, restart ${{SLURM_RESTART_COUNT:-0}}"',
        "",
        "# one torchrun per node; it starts this node's ranks and numbers them with the other nodes'",
        "srun --kill-on-bad-exit=1 torchrun \\",
        f'    --nnodes="$SLURM_NNODES" --nproc-per-node={job.gpus_per_node} \\',
        f'    --rdzv-backend=c10d --rdzv-endpoint="$HEAD:{job.rdzv_port}" --rdzv-id="$SLURM_JOB_ID" \\',
        f"    {job.executor_command(break_before_flags=CONTINUATION)}",
    ]


def _check_time(time_limit: str) -> None:
    """Slurm's time formats: MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS."""
    if not re.fullmatch(r"(\d+-)?\d+(:\d{1,2}){0,2}", time_limit):
        raise RunError(f"--time {time_limit!r}: expected Slurm's HH:MM:SS or D-HH:MM:SS.")


def sbatch_options(script: str) -> dict[str, str]:
    """The ``#SBATCH --name=value`` lines of a script, by name (``--requeue`` maps to "")."""
    options = {}
    for line in script.splitlines():
        if line.startswith("#SBATCH "):
            name, _, value = line[len("#SBATCH ") :].strip().partition("=")
            options[name] = value
    return options
