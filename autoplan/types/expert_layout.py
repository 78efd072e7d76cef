"""MoE Parallel Folding: the MoE layers' own layout ``expert_tp x ep x edp`` beside the attention layers'
``tp x cp x dp`` over the same ranks of a pipeline stage (Liu et al. 2025, arXiv 2504.14960; Megatron-Core's
``--expert-tensor-parallel-size`` and ``--expert-model-parallel-size``; docs/moe.md, "Expert tensor parallelism").

Per pipeline stage the ``dp * cp * tp`` ranks, flattened in the plan's mesh order (types/layout.py), are
laid out again as ``(edp, ep, etp)``, etp innermost (Megatron-Core's expert RankGenerator, order tp-ep-dp):

    expert_tp * ep * edp = dp * cp * tp

Each rank routes the tokens it holds, so the layout folds over the tp ranks only where they hold
different tokens: under sequence parallelism (Megatron-Core's MoE layer refuses tp > 1 without it in
training). An ep group exchanges tokens by all-to-all; an etp group all-gathers the rows it received
before the experts' matmuls, each etp rank holding ``1 / expert_tp`` of every local expert's FFN, and
reduce-scatters their output; an edp group holds the same expert shards and reduces their gradients.

Defaults: ``expert_tp = 1``, ``ep = 1`` is today's layout: at tp = 1 the experts sync over dp, at tp > 1
the MoE block runs whole on each tp rank's tokens and its gradients sync over tp (SP's all-reduce) and dp,
which is Megatron-Core at expert-tensor-parallel size 1 and expert-model-parallel size 1. The layout is
*folded* when ``ep * expert_tp > 1``: the experts' gradients then sync over edp only.
"""

from __future__ import annotations

from typing import Any

from autoplan.errors import PlanError


def experts_apart(plan: Any) -> bool:
    """Whether the routed experts have their own layout (``ep * expert_tp > 1``, module docstring): their
    parameters are split over ep x etp and their gradients reduced over edp, apart from the dense ones."""
    return plan.ep * plan.expert_tp > 1


def expert_dp(plan: Any) -> int:
    """edp: the ranks holding the same expert shards, ``dp * cp * tp / (ep * expert_tp)`` once folded; the dp
    ranks otherwise (module docstring)."""
    if not experts_apart(plan):
        return plan.dp
    return plan.dp * plan.cp * plan.tp // (plan.ep * plan.expert_tp)


def token_share(plan: Any) -> float:
    """The share of a micro-batch's tokens one rank routes: its sequence shard, 1/tp, under sequence
    parallelism (the layout folds over tp only then), else all of them."""
    return 1.0 / plan.tp if plan.sequence_parallel else 1.0


def check_expert_layout(plan: Any) -> None:
    """The rules of ``Plan.expert_tp`` and of ``ep`` beside tp (module docstring), one sentence each."""
    etp = plan.expert_tp
    if not (isinstance(etp, int) and not isinstance(etp, bool) and etp >= 1):
        raise PlanError(f"plan expert_tp={etp!r}; expected an integer >= 1.")
    if not experts_apart(plan):
        return
    ranks = plan.dp * plan.cp * plan.tp
    if ranks % (plan.ep * etp) and plan.tp == etp == 1:
        raise PlanError(
            f"plan ep={plan.ep} must divide dp={plan.dp}: expert parallelism is folded over the data-parallel ranks."
        )
    if ranks % (plan.ep * etp):
        raise PlanError(
            f"plan ep={plan.ep} x expert_tp={etp} must divide dp*cp*tp={ranks}: the experts' layout "
            "expert_tp x ep x edp folds over the ranks of one pipeline stage (docs/moe.md)."
        )
    if plan.tp > 1 and not plan.sequence_parallel:
        raise PlanError(
            f"plan ep={plan.ep}, expert_tp={etp} with tp={plan.tp} needs sequence_parallel=true: each rank "
            "routes the tokens it holds, and without sequence parallelism the tp ranks hold the same ones "
            "(Megatron-Core refuses MoE with tp > 1 and no sequence parallelism)."
        )
    if plan.cp > 1:
        raise PlanError(
            f"plan cp={plan.cp} with ep={plan.ep}, expert_tp={etp}: context parallelism does not compose with "
            "the experts' own layout yet; use cp=1, or ep=1 and expert_tp=1."
        )
