"""Gradient compression for data parallelism (``Plan.grad_compression``): none, PowerSGD (Vogels et
al. 2019) with error feedback, as torch's DDP ``powerSGD_hook`` runs it, or top-k sparsification with
error feedback (Lin et al., ICLR 2018, Deep Gradient Compression), ``topk_ratio`` of each DDP bucket's
entries sent as (index, value) pairs (autoplan/execute/topk_hook.py); docs/cost-model.md, "Lossy
gradient sync" and "Top-k sparsification"."""

from __future__ import annotations

from typing import Any

from autoplan.errors import PlanError

GRAD_COMPRESSIONS = ("none", "powersgd", "topk")
#: the ratios the search tries under --allow-lossy: DGC's 99.9% and 99% sparsity (Lin et al. 2018, section 4
#: and Table 1: 0.1% of the gradient sent from the fourth epoch, 1% while warming up)
TOPK_RATIOS = (0.001, 0.01)
#: PowerSGD compresses from this step on (torch's ``start_powerSGD_iter``: > 1 with error feedback)
POWERSGD_START_ITER = 2


def check_compression(plan: Any) -> None:
    """PowerSGD's rules on a plan: a known compression, a rank >= 1 only with it, and a plan that runs it
    (a DDP communication hook over fp32 gradients); one sentence naming the rule otherwise."""
    if plan.grad_compression not in GRAD_COMPRESSIONS:
        raise PlanError(
            f"plan grad_compression='{plan.grad_compression}'; expected one of {', '.join(GRAD_COMPRESSIONS)}."
        )
    _check_topk_ratio(plan)
    if plan.grad_compression == "none":
        if not (plan.powersgd_rank == 0):
            raise PlanError(f"plan powersgd_rank={plan.powersgd_rank} without grad_compression='powersgd'; use 0.")
        return
    if plan.grad_compression == "topk":
        _check_topk_runs(plan)
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


def _check_topk_ratio(plan: Any) -> None:
    """``topk_ratio``: in (0, 1] with grad_compression 'topk', 0 otherwise."""
    ratio = plan.topk_ratio
    if not (isinstance(ratio, (int, float)) and not isinstance(ratio, bool)):
        raise PlanError(f"plan topk_ratio={ratio!r}; expected a number.")
    if plan.grad_compression != "topk" and ratio != 0:
        raise PlanError(f"plan topk_ratio={ratio} without grad_compression='topk'; use 0.")
    if plan.grad_compression == "topk" and not (0 < ratio <= 1):
        raise PlanError(f"plan topk_ratio={ratio}; top-k sends a fraction of each bucket in (0, 1], e.g. 0.01.")


def _check_topk_runs(plan: Any) -> None:
    """Top-k runs as a DDP communication hook over fp32 gradients, with no PowerSGD rank."""
    if not (plan.powersgd_rank == 0):
        raise PlanError(f"plan powersgd_rank={plan.powersgd_rank} with grad_compression='topk'; use 0.")
    if not (plan.runs_ddp and plan.ep == 1):
        raise PlanError(
            f"plan grad_compression='topk' with {plan.describe()}: top-k runs as a DDP communication "
            "hook, so it needs dp > 1, tp = pp = ep = 1, zero_stage 0 and overlap_grad_reduce."
        )
    if not (plan.grad_reduce_dtype == "fp32"):
        raise PlanError(
            f"plan grad_compression='topk' with grad_reduce_dtype='{plan.grad_reduce_dtype}': top-k selects "
            "from fp32 gradients; use grad_reduce_dtype 'fp32'."
        )


def topk_lossy(plan: Any) -> list[str]:
    """Plan.lossy's words for top-k: lossy below a ratio of 1 (at 1 every entry is sent)."""
    if plan.grad_compression != "topk" or plan.topk_ratio >= 1:
        return []
    return [f"top-k sparsification at {plan.topk_ratio:.3g} of each bucket"]
