"""Which plans the search prices with the EP all-to-all overlapped (``Plan.moe_a2a_overlap``; docs/cost-model.md,
"EP all-to-all overlap"): only for a runtime that runs it, where that runtime's conditions hold
(autoplan/types/moe_overlap.py: autoplan's executor in DualPipeV's F&B pairs, Megatron-Core's combined 1F1B), and
beside the same plan without it, which the search keeps when it is faster or fits where the overlapped one does
not. ``--fix moe_a2a_overlap=on`` overlaps every plan that can (the others are skipped) and is refused in one
sentence for a runtime that cannot;
``=off`` overlaps none. Where a group may overlap, its step-time floor keeps only the share of the all-to-all
an overlap cannot hide (cost/moe/a2a_overlap.py, ``A2A_EXPOSED_FLOOR``), and a plan's floor from its stages
(bound (2) of solve/search.py, which prices the all-to-all exposed) is lowered by the most its twin could hide,
``m (1 - A2A_EXPOSED_FLOOR)`` times every block's all-to-all of one micro-batch.
"""

from __future__ import annotations

from dataclasses import replace

from autoplan.cost import A2A_EXPOSED_FLOOR, a2a_paired_share
from autoplan.errors import PlanError
from autoplan.types.moe_overlap import A2A_OVERLAP_RUNTIMES, executor_may_overlap, overlap_refusal
from autoplan.types.plan import Plan


def check_pin(fixes: dict, runtime: str) -> None:
    """A pinned overlap the runtime or another pin rules out: one sentence."""
    if not fixes.get("moe_a2a_overlap"):
        return
    if runtime not in A2A_OVERLAP_RUNTIMES:
        raise PlanError(
            f"--fix moe_a2a_overlap=on with runtime '{runtime}', which cannot overlap the EP all-to-all; plan with "
            "--runtime autoplan (DualPipeV's F&B pairs) or megatron (--overlap-moe-expert-parallel-comm), or drop "
            "the pin."
        )
    if runtime == "autoplan" and fixes.get("schedule", "dualpipev") != "dualpipev":
        raise PlanError(
            f"--fix moe_a2a_overlap=on with schedule={fixes['schedule']}: autoplan's executor overlaps the EP "
            "all-to-all only in DualPipeV's F&B pairs; pin schedule=dualpipev or drop one pin."
        )
    if fixes.get("ep") == 1 or fixes.get("recompute") == "full":
        clash = "ep=1" if fixes.get("ep") == 1 else "recompute=full"
        raise PlanError(
            f"--fix moe_a2a_overlap=on with {clash}: the overlap needs expert parallelism and a forward not re-run "
            "inside the backward (Megatron-Core refuses full recomputation beside it); drop one pin."
        )


def may_overlap(fixes: dict, runtime: str) -> bool:
    """Whether some plan of the search may overlap the all-to-all."""
    return runtime in A2A_OVERLAP_RUNTIMES and fixes.get("moe_a2a_overlap") is not False


def a2a_floor_share(fixes: dict, runtime: str, degrees=None) -> float:
    """The least share of the all-to-all a plan of the search leaves on its step (module docstring); with a group's
    ``degrees`` (solve/space.py Degrees), 1 where autoplan's executor could overlap none of its plans."""
    if runtime == "autoplan" and degrees is not None and not executor_may_overlap(degrees):
        return 1.0
    return A2A_EXPOSED_FLOOR if may_overlap(fixes, runtime) else 1.0


def hideable_s(stage_costs, plan: Plan, fixes: dict) -> float:
    """The most ``plan``'s overlapped twin could hide from its step (module docstring); 0 where it has none.
    ``stage_costs`` is the search's solve/stage_costs.py StageCosts."""
    if plan.ep <= 1 or not may_overlap(fixes, plan.runtime):
        return 0.0
    if plan.runtime == "autoplan" and (plan.schedule != "dualpipev" or not executor_may_overlap(plan)):
        return 0.0  # no twin under any ZeRO stage (the members of one bound differ in it)
    ctx = stage_costs.context(plan)
    blocks = stage_costs.cost_model.block_summaries(plan.tp_plan, ctx, plan.tp_comm_overlap).values()
    return plan.num_microbatches * (1.0 - A2A_EXPOSED_FLOOR) * sum(b.ep_fwd_s + b.ep_bwd_s for b in blocks)


def _overlapped(plan: Plan) -> Plan | None:
    """``plan`` with its all-to-all overlapped, or None where its runtime cannot run that or no micro-batches
    pair (every one runs alone in the warm-up and cool-down: the overlap would change nothing)."""
    if plan.ep <= 1 or overlap_refusal(plan):
        return None
    share = a2a_paired_share(
        num_microbatches=plan.num_microbatches, pp=plan.pp, virtual_stages=plan.virtual_stages, schedule=plan.schedule
    )
    if share == 0:
        return None
    try:
        return replace(plan, moe_a2a_overlap=True)
    except PlanError:
        return None


def with_pin(plan: Plan | None, fixes: dict) -> Plan | None:
    """The plan the search prices under the pin: overlapped when pinned on (None when it cannot be)."""
    if plan is None or not fixes.get("moe_a2a_overlap") or plan.moe_a2a_overlap:
        return plan
    return _overlapped(plan)


def overlapped_twin(plan: Plan, fixes: dict) -> Plan | None:
    """The same plan with its all-to-all overlapped, priced beside it (module docstring); None where not."""
    if plan.moe_a2a_overlap or not may_overlap(fixes, plan.runtime):
        return None
    return _overlapped(plan)
