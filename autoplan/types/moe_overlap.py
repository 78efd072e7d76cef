"""The EP all-to-all overlap (``Plan.moe_a2a_overlap``): which plans may ask for it, and which runtimes run it
(docs/cost-model.md, "EP all-to-all overlap"; the price: autoplan/cost/moe/a2a_overlap.py).

Two micro-batches run together, the forward of one beside the backward of the other, each all-to-all on a
communication stream beside the other's compute. Megatron-Core runs it under
``--overlap-moe-expert-parallel-comm`` (TransformerConfig.__post_init__, core_v0.16.1): ep > 1, the
alltoall dispatcher, bf16 or fp16 weights, no full recomputation, and at pp > 1 virtual stages. autoplan's
executor cannot: its pipeline schedules (torch.distributed.pipelining) run one micro-batch's forward or
backward at a time on a rank, and torch's DualPipeV runs its overlapped F and B one after the other unless a
custom overlap function is registered; so the search offers it only for :data:`A2A_OVERLAP_RUNTIMES`. No runtime
runs DualPipeV's pairs overlapped: Megatron-Core has no DualPipeV, and torchtitan 0.3 registers an ``OVERLAP_F_B``
function only in its experimental graph_trainer, which runs the two graphs one after the other without the EP
overlap (graph_pp/graph_multiplex.py); such a plan is priced through the cost model API alone.
"""

from __future__ import annotations

from typing import Any

from autoplan.errors import PlanError

#: runtimes that run the overlap: Megatron-Core's combined 1F1B
A2A_OVERLAP_RUNTIMES = ("megatron",)
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
    if plan.runtime not in A2A_OVERLAP_RUNTIMES:
        return (
            f"runtime '{plan.runtime}' cannot overlap the EP all-to-all: autoplan's executor runs one micro-batch's "
            "forward or backward at a time on a rank; price it for runtime 'megatron' (--runtime megatron), which "
            "runs it as --overlap-moe-expert-parallel-comm"
        )
    return megatron_refusal(plan)


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
    """Refuse, in one sentence, to run or launch ``plan`` with the overlap on autoplan's executor (module
    docstring); ``autoplan run`` and ``launch`` call it before any rank starts, ``parallelize`` first."""
    if plan.moe_a2a_overlap:
        raise PlanError(
            "plan moe_a2a_overlap=true: autoplan's executor runs one micro-batch's forward or backward at a time on a "
            "rank, so nothing runs beside the all-to-all; set moe_a2a_overlap to false to run here."
        )
