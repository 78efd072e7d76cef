"""Gradient compression for data parallelism (``Plan.grad_compression``): none, or PowerSGD (Vogels et
al. 2019) with error feedback, as torch's DDP ``powerSGD_hook`` runs it; docs/cost-model.md, "Lossy
gradient sync"."""

from __future__ import annotations

from typing import Any

from autoplan.errors import PlanError

GRAD_COMPRESSIONS = ("none", "powersgd")
#: PowerSGD compresses from this step on (torch's ``start_powerSGD_iter``: > 1 with error feedback)
POWERSGD_START_ITER = 2


def check_compression(plan: Any) -> None:
    """PowerSGD's rules on a plan: a known compression, a rank >= 1 only with it, and a plan that runs it
    (a DDP communication hook over fp32 gradients); one sentence naming the rule otherwise."""
    if plan.grad_compression not in GRAD_COMPRESSIONS:
        raise PlanError(
            f"plan grad_compression='{plan.grad_compression}'; expected one of {', '.join(GRAD_COMPRESSIONS)}."
        )
    if plan.grad_compression == "none":
        if not (plan.powersgd_rank == 0):
            raise PlanError(f"plan powersgd_rank={plan.powersgd_rank} without grad_compression='powersgd'; use 0.")
        return
    if not (isinstance(plan.powersgd_rank, int) and plan.powersgd_rank >= 1):
        raise PlanError(f"plan powersgd_rank={plan.powersgd_rank!r}; PowerSGD needs a rank >= 1.")
    if not (plan.runs_ddp and plan.ep == 1):
        raise PlanError(
            f"plan grad_compression='powersgd' with {plan.describe()}: PowerSGD runs as a DDP communication "
            "hook, so it needs dp > 1, tp = pp = ep = 1, zero_stage 0 and overlap_grad_reduce."
        )
    if not (plan.grad_reduce_dtype == "fp32"):
        raise PlanError(
            f"plan grad_compression='powersgd' with grad_reduce_dtype='{plan.grad_reduce_dtype}': PowerSGD "
            "compresses fp32 gradients; use grad_reduce_dtype 'fp32'."
        )
