"""The rules that tie a plan's overlap switches to the layout they overlap (``Plan.tp_comm_overlap``,
``overlap_grad_reduce``, ``overlap_param_gather``; docs/plan-format.md)."""

from __future__ import annotations

from typing import Any

from autoplan.errors import PlanError


def check_overlaps(plan: Any) -> None:
    """Each overlap switch names collectives the plan sends; one sentence naming the rule otherwise."""
    if plan.tp_comm_overlap and not plan.sequence_parallel:
        raise PlanError(
            "plan tp_comm_overlap=true needs sequence_parallel=true: the overlapped collectives are sequence "
            "parallelism's all-gather before and reduce-scatter after each split matmul."
        )
    if not (plan.overlap_grad_reduce or plan.zero_stage < 2):
        raise PlanError(
            "plan overlap_grad_reduce=false with ZeRO-2/3: FSDP2 reduce-scatters each block's gradients during the "
            "backward; use zero_stage 0 or 1 for a reduction after the backward."
        )
    if plan.overlap_param_gather and not (plan.zero_stage in (1, 2) and plan.overlap_grad_reduce):
        raise PlanError(
            "plan overlap_param_gather=true needs zero_stage 1 or 2 with overlap_grad_reduce (as Megatron-LM's "
            "--overlap-param-gather does); ZeRO-3 always gathers each block's weights ahead of its use."
        )
