"""The EP all-to-all overlap (``Plan.moe_a2a_overlap``): which plans may ask for it, and which runtimes run it
(docs/cost-model.md, "EP all-to-all overlap"; the price: autoplan/cost/moe/a2a_overlap.py).

Two micro-batches run together, the forward of one beside the backward of the other, each all-to-all beside the
other's compute. Megatron-Core runs it under ``--overlap-moe-expert-parallel-comm`` (TransformerConfig.__post_init__,
core_v0.16.1): ep > 1, the alltoall dispatcher, bf16 or fp16 weights, no full recomputation, and at pp > 1 virtual
stages. autoplan's executor runs it in DualPipeV's F&B pairs (autoplan/execute/overlap_f_b.py: the backward half on
a second thread, its all-to-alls on a second ep group), where no collective but the ep group's runs inside a
forward or backward: tp, cp and expert_tp 1 (their collectives on one group from two threads would meet in an
order the ranks do not share) and ZeRO below 2 (FSDP2 gathers and reduces inside them). Selective recomputation,
budgeted or not, runs there: a block re-run in the backward half keeps its all-to-alls' outputs and sends nothing
again (types/saved_ops.py ``SAVED_COLLECTIVES``), as priced; full recomputation is refused for every runtime, as
Megatron-Core refuses it. Other pipeline schedules run one micro-batch's forward or backward at a time on a rank.
"""

from __future__ import annotations

from typing import Any

from autoplan.errors import PlanError

#: runtimes that run the overlap: autoplan's executor in DualPipeV's F&B pairs, Megatron-Core's combined 1F1B
A2A_OVERLAP_RUNTIMES = ("autoplan", "megatron")
#: precisions whose weights Megatron-Core's overlap accepts ("only supported with bf16 or fp16 model"; fp8 trains
#: bf16 weights with --bf16)
A2A_OVERLAP_PRECISIONS = ("bf16", "fp16", "fp8")


def check_moe_a2a_overlap(plan: Any) -> None:
    """What every plan asking for the overlap needs, one sentence each: expert parallelism to overlap, and a
    forward that is not re-run whole in the backward (full recomputation re-runs the forward's all-to-alls
    inside the backward, which Megatron-Core refuses beside the overlap)."""
    if not isinstance(plan.moe_a2a_overlap, bool):
        raise PlanError(f"plan moe_a2a_overlap={plan.moe_a2a_overlap!r}; expected true or false.")
    if not plan.moe_a2a_overlap:
        return
    if plan.ep <= 1:
        raise PlanError(
            "plan moe_a2a_overlap=true needs ep > 1: it overlaps the expert-parallel all-to-all, and at ep=1 "
            "there is none; use ep > 1 or moe_a2a_overlap=false."
        )
    if plan.recompute == "full":
        raise PlanError(
            "plan moe_a2a_overlap=true with recompute='full': the overlap pairs one micro-batch's forward with "
            "another's backward, and full recomputation re-runs the forward inside the backward (Megatron-Core "
            "refuses the two together); use recompute 'none' or 'selective', or moe_a2a_overlap=false."
        )


def overlap_refusal(plan: Any) -> str:
    """Why ``plan``'s runtime cannot run the overlap ('' when it can), as one clause (module docstring)."""
    if plan.runtime == "autoplan":
        return executor_refusal(plan)
    if plan.runtime not in A2A_OVERLAP_RUNTIMES:
        return (
            f"runtime '{plan.runtime}' cannot overlap the EP all-to-all; price it for runtime 'autoplan' (DualPipeV's "
            "F&B pairs) or 'megatron' (--overlap-moe-expert-parallel-comm)"
        )
    return megatron_refusal(plan)


def executor_refusal(plan: Any) -> str:
    """Which of autoplan's executor's conditions for the overlap ``plan`` misses ('' for none; module docstring)."""
    if plan.schedule != "dualpipev":
        return (
            "autoplan's executor overlaps the EP all-to-all only in DualPipeV's F&B pairs (schedule dualpipev); "
            f"{plan.schedule} runs one micro-batch's forward or backward at a time on a rank"
        )
    shared = [f"{name}={value}" for name, value in (("tp", plan.tp), ("cp", plan.cp), ("expert_tp", plan.expert_tp))]
    shared = [pair for pair in shared if not pair.endswith("=1")]
    if shared or plan.zero_stage >= 2:
        what = ", ".join(shared) or f"zero_stage={plan.zero_stage}"
        return (
            "autoplan's executor overlaps the EP all-to-all only where the ep group's are the only collectives inside "
            f"a forward or backward (tp, cp and expert_tp 1, zero_stage 0 or 1), not at {what}"
        )
    return ""


def executor_may_overlap(degrees: Any) -> bool:
    """Whether some plan of a search group with these degrees (pp, tp, cp, ep, expert_tp) may run the overlap on
    autoplan's executor (:func:`executor_refusal`, its schedule aside)."""
    return degrees.pp > 1 and degrees.ep > 1 and degrees.tp == degrees.cp == degrees.expert_tp == 1


def megatron_refusal(plan: Any) -> str:
    """Which of Megatron-Core's conditions for the overlap ``plan`` misses ('' for none), as one clause."""
    if plan.precision not in A2A_OVERLAP_PRECISIONS:
        return f"Megatron-Core overlaps the EP all-to-all only with bf16 or fp16 weights, not {plan.precision}"
    if plan.pp > 1 and plan.virtual_stages == 1:
        return "Megatron-Core overlaps the EP all-to-all at pp > 1 only with virtual stages (interleaved 1F1B)"
    if plan.schedule not in ("1f1b", "interleaved_1f1b"):
        return f"Megatron-Core overlaps the EP all-to-all under 1F1B only, and the plan's schedule is {plan.schedule}"
    return ""


def check_executor_runs(plan: Any) -> None:
    """Refuse, in one sentence, to run or launch ``plan`` with the overlap where autoplan's executor cannot
    (:func:`executor_refusal`); ``autoplan run`` and ``launch`` call it before any rank starts, ``parallelize``
    first."""
    why = executor_refusal(plan) if plan.moe_a2a_overlap else ""
    if why:
        raise PlanError(f"plan moe_a2a_overlap=true: {why}; set moe_a2a_overlap to false to run here.")
