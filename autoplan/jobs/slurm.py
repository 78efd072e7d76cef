"""A Slurm batch script for a :class:`~autoplan.jobs.nodejob.NodeJob`: ``sbatch FILE`` runs the plan.

The script asks for ``nodes`` nodes with one task each (``--ntasks-per-node=1``): that task is
torchrun's agent, which starts the node's ``gpus_per_node`` ranks. ``srun`` runs the agent once
per node with the job's ``--cpus-per-task`` (since Slurm 22.05 srun no longer inherits it from
sbatch); the agents meet in a c10d rendezvous hosted on the job's first node
(``scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1``), keyed by ``$SLURM_JOB_ID``, and
number the ranks among themselves, so no node rank is passed. ``--kill-on-bad-exit=1`` ends every
node when one fails, rather than leaving the others to time out on a collective. The model's size
variables (``NodeJob.environment``) are exported before srun, so every rank builds the model the
plan was made for.

Stops and restarts: ``--requeue`` lets Slurm queue the job again after a node failure or a
preemption. At the time limit Slurm does not requeue, so the script does:
``--signal=B:USR1@LEAD`` sends USR1 to the batch shell LEAD seconds before the limit; its trap
sends SIGTERM to the srun step (srun passes it to each node's torchrun, torchrun to its ranks),
whose ranks finish their step, write a final checkpoint and exit; torchrun waits
``--shutdown-timeout`` for that before SIGKILL. The trap then runs ``scontrol requeue``: the
requeued job runs this script again and ``autoplan run --checkpoint-dir D`` resumes from the newest
complete checkpoint in D by itself (autoplan/cli/checkpoints.py), so D must be on storage every
node shares. A SIGTERM to the batch shell (``scancel``, a preemption) stops the step the same way,
without the requeue. :func:`stop_times` derives both times from the plan's predicted checkpoint
write. ``--open-mode=append`` keeps the log of every attempt.
"""

from __future__ import annotations

import math
import re
import shlex
from dataclasses import dataclass

from autoplan.errors import RunError
from autoplan.jobs.elastic import SHUTDOWN_TIMEOUT_S
from autoplan.jobs.nodejob import NodeJob

#: CPU cores asked per node when no --cpus-per-node is given: 8 per rank, a common GPU node's share.
CPUS_PER_RANK = 8
#: A shell line continuation and the indent of an argument of the per-node command.
CONTINUATION = "\\\n        "
#: Margin on the predicted stop (a step and a checkpoint write): the prediction's error, and
#: storage shared with other jobs at the moment every rank writes.
STOP_SAFETY = 2.0
#: Seconds between torchrun's last SIGKILL and Slurm's time limit: srun passing the signal on,
#: ``scontrol requeue``, and Slurm's own signal timing (it may signal up to 60 s early or late).
REQUEUE_SLACK_S = 60
#: The largest lead time ``--signal`` accepts (sbatch(1): 0 to 65535 seconds).
MAX_SIGNAL_LEAD_S = 65535


@dataclass(frozen=True)
class StopTimes:
    """torchrun's ``--shutdown-timeout`` and the ``--signal`` lead time, and what they came from."""

    shutdown_timeout_s: int
    signal_lead_s: int
    basis: str


def stop_times(*, step_time_s: float | None, checkpoint_write_s: float | None) -> StopTimes:
    """How long the ranks get to stop, and how early before the time limit they are told.

    A stopping rank finishes its step and then writes its checkpoint (docs/elastic.md), so the
    predicted stop is D = T_step + W, T_step and W the plan's ``predicted.step_time_s`` and
    ``predicted.checkpoint_write_s`` (W = C / min(N w, cap), cost/run/reliability.py). Then

        shutdown_timeout = ceil(STOP_SAFETY * D) + SHUTDOWN_TIMEOUT_S   (60 s: the floor autoplan's
                                                                        own elastic launcher grants)
        lead             = shutdown_timeout + REQUEUE_SLACK_S

    Without W (a profile without a storage section) D is unknown: shutdown 60 s, lead 120 s."""
    if checkpoint_write_s is None:
        shutdown_s = SHUTDOWN_TIMEOUT_S
        basis = "the plan predicts no checkpoint write (its profile has no storage section), so the defaults"
    else:
        stop_s = (step_time_s or 0.0) + checkpoint_write_s
        shutdown_s = math.ceil(STOP_SAFETY * stop_s) + SHUTDOWN_TIMEOUT_S
        basis = (
            f"from the plan's predicted step ({step_time_s or 0.0:.3g} s) and checkpoint write "
            f"({checkpoint_write_s:.3g} s): {STOP_SAFETY:g} x {stop_s:.3g} s + {SHUTDOWN_TIMEOUT_S} s"
        )
    lead_s = shutdown_s + REQUEUE_SLACK_S
    if lead_s > MAX_SIGNAL_LEAD_S:
        raise RunError(
            f"the ranks need {shutdown_s} s to write a final checkpoint ({basis}), more than Slurm's --signal "
            f"can warn ahead ({MAX_SIGNAL_LEAD_S} s); checkpoint to faster storage or re-plan with its profile."
        )
    return StopTimes(shutdown_timeout_s=shutdown_s, signal_lead_s=lead_s, basis=basis)


def sbatch_script(
    job: NodeJob,
    *,
    time_limit: str,
    output: str,
    stop: StopTimes,
    partition: str | None = None,
    cpus_per_node: int | None = None,
    header: str = "",
    shutdown_flag: bool = True,
) -> str:
    """The batch script (module docstring); ``output`` is the log path (``%j`` = job id), in a
    folder that exists when the job starts (Slurm does not create it). ``shutdown_flag`` False
    leaves out torchrun's ``--shutdown-timeout``, which an older torch does not accept
    (it came with pytorch/pytorch#172596)."""
    _check_time(time_limit, stop)
    cpus = cpus_per_node or CPUS_PER_RANK * job.gpus_per_node
    if cpus < 1:
        raise RunError(f"--cpus-per-node {cpus}: expected at least 1 core.")
    lines = ["#!/bin/bash", *(f"# {line}" for line in header.splitlines())]
    lines += [f"#SBATCH {option}" for option in _options(job, time_limit, output, partition, cpus, stop)]
    lines += ["", "set -eu  # no pipefail: `head -n 1` may close scontrol's pipe early, which is no error"]
    lines += [*_environment(job), *_rendezvous(job), *_traps(stop), *_step(job, cpus, stop, shutdown_flag)]
    return "\n".join(lines) + "\n"


def _options(job: NodeJob, time_limit: str, output: str, partition: str | None, cpus: int, stop: StopTimes) -> list:
    options = [f"--job-name={job.name}", f"--nodes={job.nodes}", "--ntasks-per-node=1"]
    if job.uses_gpus:
        options.append(f"--gpus-per-node={job.gpus_per_node}")
    options += [f"--cpus-per-task={cpus}", f"--time={time_limit}"]
    if partition:
        options.append(f"--partition={partition}")
    return options + [f"--output={output}", "--open-mode=append", "--requeue", f"--signal=B:USR1@{stop.signal_lead_s}"]


def _environment(job: NodeJob) -> list[str]:
    if not job.environment:
        return []
    lines = ["", "# the model's sizes the plan was made with: every rank builds that model"]
    return lines + [f"export {name}={shlex.quote(value)}" for name, value in job.environment]


def _rendezvous(job: NodeJob) -> list[str]:
    return [
        "",
        "# the c10d rendezvous store runs on the job's first node",
        'HEAD=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
        'echo "autoplan: job $SLURM_JOB_ID on $SLURM_NNODES nodes, rendezvous at $HEAD:'
        f'{job.rdzv_port}, restart ${{SLURM_RESTART_COUNT:-0}}"',
    ]


def _traps(stop: StopTimes) -> list[str]:
    return [
        "",
        "# a stop (USR1 before the time limit, or a SIGTERM) reaches every rank through srun and torchrun;",
        "# the ranks finish their step, write a final checkpoint and exit",
        "stop_step() {  # the step is this shell's one background job",
        "    kill -TERM $(jobs -p) 2>/dev/null || true",
        "    wait || true",
        "}",
        "requeue_at_time_limit() {",
        f'    echo "autoplan: the time limit is {stop.signal_lead_s} s away: checkpointing, then requeueing'
        ' job $SLURM_JOB_ID"',
        "    stop_step",
        '    scontrol requeue "$SLURM_JOB_ID"  # the requeued job resumes from the checkpoint',
        "    exit 0",
        "}",
        "trap requeue_at_time_limit USR1",
        "trap 'stop_step; exit 143' TERM",
    ]


def _step(job: NodeJob, cpus: int, stop: StopTimes, shutdown_flag: bool) -> list[str]:
    shutdown = [f"    --shutdown-timeout={stop.shutdown_timeout_s} \\"] if shutdown_flag else []
    return [
        "",
        "# one torchrun per node; it starts this node's ranks and numbers them with the other nodes'",
        f"srun --kill-on-bad-exit=1 --cpus-per-task={cpus} torchrun \\",
        f'    --nnodes="$SLURM_NNODES" --nproc-per-node={job.gpus_per_node} \\',
        f'    --rdzv-backend=c10d --rdzv-endpoint="$HEAD:{job.rdzv_port}" --rdzv-id="$SLURM_JOB_ID" \\',
        *shutdown,
        f"    {job.executor_command(break_before_flags=CONTINUATION)} &",
        'wait "$!"  # the step runs in the background, so that the traps run while it trains',
    ]


def _check_time(time_limit: str, stop: StopTimes) -> None:
    """Slurm's time formats: MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS; longer than the lead."""
    if not re.fullmatch(r"(\d+-)?\d+(:\d{1,2}){0,2}", time_limit):
        raise RunError(f"--time {time_limit!r}: expected Slurm's HH:MM:SS or D-HH:MM:SS.")
    if (limit_s := time_limit_s(time_limit)) <= stop.signal_lead_s:
        raise RunError(
            f"--time {time_limit} ({limit_s} s) leaves no time to train before the ranks are told to checkpoint "
            f"{stop.signal_lead_s} s ahead of the limit; give a longer --time."
        )


def time_limit_s(time_limit: str) -> int:
    """Seconds in a Slurm time limit (sbatch(1) ``--time``: a bare number is minutes; ``D-H[:M[:S]]``)."""
    days, _, clock = time_limit.rpartition("-")
    parts = [int(part) for part in clock.split(":")]
    if days:
        units = (3600, 60, 1)  # D-HH, D-HH:MM, D-HH:MM:SS
    else:
        units = {1: (60,), 2: (60, 1), 3: (3600, 60, 1)}[len(parts)]  # MM, MM:SS, HH:MM:SS
    return int(days or 0) * 86400 + sum(part * unit for part, unit in zip(parts, units))


def sbatch_options(script: str) -> dict[str, str]:
    """The ``#SBATCH --name=value`` lines of a script, by name (``--requeue`` maps to "")."""
    options = {}
    for line in script.splitlines():
        if line.startswith("#SBATCH "):
            name, _, value = line[len("#SBATCH ") :].strip().partition("=")
            options[name] = value
    return options
