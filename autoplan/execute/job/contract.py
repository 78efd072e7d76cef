"""What ``autoplan run``'s launcher must know of its ranks before it starts them, importable without
the executor (``autoplan/cli/execute.py`` checks the options and launches; a rank imports the whole
executor, DTensor, FSDP2 and the checkpoint reader, 2-3 s of CPU that the launcher, which waits on its
ranks, need not spend first): the exit codes every rank returns together, which end the job without
being a rank's failure, and how many steps ``--verify`` compares (docs/executor.md, "CLI").

Steps compared: 2 at least (DDP rebuilds its buckets after the first, the optimizer first reads its
states in the second), ``POWERSGD_START_ITER + 1`` with PowerSGD (its first steps run uncompressed).
"""

from __future__ import annotations

from autoplan.types.grad_compression import POWERSGD_START_ITER
from autoplan.types.plan import Plan

EXIT_VERIFY_FAILED = 3
EXIT_STOPPED = 143  # 128 + SIGTERM: stopped by a signal after a final checkpoint
EXIT_NONFINITE_LOSS = 4
#: exits every rank returns together: the job's answer, not a failed rank
AGREED_EXITS = (EXIT_VERIFY_FAILED, EXIT_STOPPED, EXIT_NONFINITE_LOSS)

#: steps every plan is compared over (module docstring)
STEADY_STEPS = 2


def verify_steps(plan: Plan) -> int:
    """How many weight-changing steps --verify compares for ``plan`` (module docstring)."""
    if plan.grad_compression == "powersgd":
        return max(STEADY_STEPS, POWERSGD_START_ITER + 1)
    return STEADY_STEPS


def why_steps(plan: Plan) -> str:
    """The reason for :func:`verify_steps`, in words."""
    if plan.grad_compression == "powersgd":
        return f"PowerSGD compresses from step {POWERSGD_START_ITER} on"
    return "DDP's rebuilt buckets and the optimizer's states are first used in the second step"
