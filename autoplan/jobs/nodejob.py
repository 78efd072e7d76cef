"""One training job over whole nodes: what every cluster launcher's file is written from.

A plan needs ``devices`` ranks; a cluster hands out nodes of ``gpus_per_node`` devices, so the
job takes ``nodes = devices / gpus_per_node`` of them and runs one ``torchrun`` per node, each
starting ``gpus_per_node`` ranks of ``python -m autoplan.cli run MODEL --plan PLAN ...``: under
torchrun (RANK and WORLD_SIZE set) ``autoplan run`` is one rank of the job (autoplan/cli/execute.py).
Devices that are not whole nodes are refused in one sentence. :mod:`autoplan.jobs.slurm` and
:mod:`autoplan.jobs.cloud` render a :class:`NodeJob` as an sbatch script, a SkyPilot task or a
TorchX component (docs/launch.md).
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

from autoplan.errors import RunError
from autoplan.types.run_options import RunOptions

#: torchrun's default rendezvous port (the c10d store on the first node).
DEFAULT_RDZV_PORT = 29500


@dataclass(frozen=True)
class NodeJob:
    """``devices`` ranks on ``devices / gpus_per_node`` nodes, each running ``executor_args``.

    ``executor_args`` follow ``python -m autoplan.cli`` (``("run", MODEL, "--plan", PLAN, ...)``,
    see :func:`executor_args`); ``uses_gpus`` is False for CPU nodes (a gloo profile), whose ranks
    ask the scheduler for no GPU; ``accelerator`` is the cloud name of the node's GPU (``"H100"``),
    None when unknown (SkyPilot then needs one: :mod:`autoplan.jobs.cloud`). ``environment`` holds
    the ``(NAME, value)`` variables every rank needs set: the model file's sizes the plan was made
    with (``AUTOPLAN_GPT_N_LAYER``...), which a node's fresh shell would not have.
    """

    name: str
    devices: int
    gpus_per_node: int
    executor_args: tuple[str, ...]
    uses_gpus: bool = True
    accelerator: str | None = None
    rdzv_port: int = DEFAULT_RDZV_PORT
    environment: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        if self.gpus_per_node < 1:
            raise RunError(f"--gpus-per-node {self.gpus_per_node}: expected at least 1 device per node.")
        if self.devices % self.gpus_per_node:
            raise RunError(
                f"the plan's {self.devices} devices are not whole nodes of {self.gpus_per_node}; "
                "pass --gpus-per-node with a divisor of the device count, or plan for a multiple of it."
            )
        if not 0 < self.rdzv_port < 65536:
            raise RunError(f"--rdzv-port {self.rdzv_port}: expected a TCP port between 1 and 65535.")
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", self.name):
            raise RunError(f"job name {self.name!r}: expected letters, digits, '.', '_' and '-' only.")
        for name, _ in self.environment:
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
                raise RunError(f"environment variable {name!r}: expected letters, digits and '_', not a digit first.")

    @property
    def nodes(self) -> int:
        return self.devices // self.gpus_per_node

    def executor_command(self, *, break_before_flags: str = "") -> str:
        """``-m autoplan.cli run ...``, quoted for a POSIX shell (what torchrun starts per rank);
        ``break_before_flags`` (e.g. a backslash-newline and indent) goes before each ``--flag``."""
        words = ["-m", "autoplan.cli", *(shlex.quote(arg) for arg in self.executor_args)]
        return " ".join(break_before_flags + word if word.startswith("--") else word for word in words)


def executor_args(
    *, model: str, plan: str, steps: int, run_dir: str, checkpoint_dir: str | None, checkpoint_every: int | None = None
) -> tuple[str, ...]:
    """The ``autoplan run`` arguments every rank of the job runs (paths as the nodes see them),
    written from the run's options (autoplan/types/run_options.py)."""
    checkpoints = {"checkpoint_dir": checkpoint_dir, "checkpoint_every": checkpoint_every}
    return RunOptions(model=model, plan=plan, steps=steps, out=run_dir, **checkpoints).command_words()


def job_name(text: str) -> str:
    """A scheduler-safe job name from a file stem: ``autoplan-`` and letters, digits, ``._-``."""
    cleaned = re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-.") or "job"
    return f"autoplan-{cleaned}"[:63]
