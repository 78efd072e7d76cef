"""Which model states a plan holds in host memory (``Plan.offload``; docs/cost-model.md, "Offload").

- "none": all on the device;
- "optimizer": the fp32 master weights, the Adam moments and the step on the host, the gradients copied
  down and the updated weights up once per step (DeepSpeed's ZeRO-Offload, Ren et al., USENIX ATC'21);
  autoplan's executor runs it on ZeRO-1's sharded optimizer (autoplan/execute/offload.py), or at ZeRO-0 on one
  dp x cp rank (:func:`one_rank_offload`);
- "full": also the weights and gradients, each block's weights copied up for its all-gathers and its
  gradient shard down after its reduce-scatter (FSDP2's ``CPUOffloadPolicy``, ZeRO-3, no pipeline).
"""

from __future__ import annotations

from typing import Any

from autoplan.errors import PlanError

OFFLOADS = ("none", "optimizer", "full")
#: the ZeRO stage whose executor path runs each offload
OFFLOAD_ZERO = {"optimizer": 1, "full": 3}


def check_offload(plan: Any) -> None:
    """Offload where the executor runs it (module docstring), over dp x cp > 1 ranks without experts; one
    sentence naming the rule otherwise."""
    if plan.offload not in OFFLOADS:
        raise PlanError(f"plan offload='{plan.offload}'; expected one of {', '.join(OFFLOADS)}.")
    if plan.offload == "none":
        return
    stage = OFFLOAD_ZERO[plan.offload]
    if not (plan.zero_stage == stage and plan.dp * plan.cp > 1 and plan.ep == 1 or one_rank_offload(plan)):
        what = "the optimizer step of ZeRO-1" if stage == 1 else "FSDP2's shards (ZeRO-3)"
        ranks = "dp > 1 (or zero_stage 0 on one dp x cp rank)" if stage == 1 else "dp > 1"
        raise PlanError(
            f"plan offload='{plan.offload}' with {plan.describe()}: the executor offloads {what}, so it needs "
            f"zero_stage {stage}, {ranks} and ep = 1."
        )
    if plan.offload not in runtime_offloads(plan.runtime):
        raise PlanError(
            f"plan offload='{plan.offload}' with runtime '{plan.runtime}': that runtime does not run it; use one "
            f"of {', '.join(('none',) + runtime_offloads(plan.runtime))}."
        )
    if plan.offload == "full" and plan.pp > 1:
        raise PlanError(
            "plan offload='full' with pp > 1: FSDP2's CPU offload runs here without a pipeline; use pp=1 or "
            "offload='optimizer'."
        )
    if plan.dp_replicate > 1:
        raise PlanError(
            f"plan offload='{plan.offload}' with dp_replicate={plan.dp_replicate}: the executor offloads without "
            "HSDP; use dp_replicate=1 or offload='none'."
        )
    if plan.offload == "optimizer" and plan.overlap_param_gather:
        raise PlanError(
            "plan offload='optimizer' with overlap_param_gather=true: the updated weights come up from the host "
            "after the step; use overlap_param_gather=false."
        )


def one_rank_offload(plan: Any) -> bool:
    """ZeRO-Offload on one data-parallel rank (dp x cp = 1, with or without tp and pp): the whole fp32 master and
    Adam state on the host, nothing to shard, so ZeRO-0 (Ren et al.'s one-GPU setup; execute/offload.py OneRank)."""
    return plan.offload == "optimizer" and plan.dp * plan.cp == 1 and plan.zero_stage == 0 and plan.ep == 1


#: the offloads each runtime runs (docs/export.md): autoplan's executor and DeepSpeed both; torchtitan only
#: FSDP2's CPU offload; Megatron-Core only its distributed optimizer's (--optimizer-cpu-offload)
RUNTIME_OFFLOADS = {
    "autoplan": ("optimizer", "full"),
    "deepspeed": ("optimizer", "full"),
    "torchtitan": ("full",),
    "megatron": ("optimizer",),
}


def runtime_offloads(runtime: str) -> tuple[str, ...]:
    """The offloads ``runtime`` runs besides "none"."""
    return RUNTIME_OFFLOADS.get(runtime, ())
