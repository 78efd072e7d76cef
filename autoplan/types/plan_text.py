"""The plan's one-line summary (``Plan.describe``): its layout, then each option away from its default."""

from __future__ import annotations

from typing import Any

from autoplan.types import local_sgd
from autoplan.types.recompute import describe_counts


def describe_plan(plan: Any) -> str:
    """A one-line human summary, e.g. ``dp=4 tp=2 pp=1 mbs=2x4 1f1b zero=1 rc=none bf16``."""
    sp = " sp" if plan.sequence_parallel else ""
    ep = f" ep={plan.ep}" if plan.ep > 1 else ""
    ep += f" etp={plan.expert_tp}" if plan.expert_tp > 1 else ""
    ep += f" cp={plan.cp}({plan.cp_variant})" if plan.cp > 1 else ""
    v = f" v={plan.virtual_stages}" if plan.virtual_stages > 1 else ""
    red = f" reduce={plan.grad_reduce_dtype}" if plan.grad_reduce_dtype != "fp32" else ""
    red += f" powersgd={plan.powersgd_rank}" if plan.grad_compression == "powersgd" else ""
    red += f" topk={plan.topk_ratio:g}" if plan.grad_compression == "topk" else ""
    red += "" if plan.overlap_grad_reduce else " no-overlap"
    red += " param-gather-overlap" if plan.overlap_param_gather else ""
    red += " tp-overlap" if plan.tp_comm_overlap else ""
    red += " compile" if plan.compile else ""
    red += f" recipe={plan.fp8_recipe}" if plan.fp8_recipe else ""
    red += f" offload={plan.offload}" if plan.offload != "none" else ""
    red += " offload-act" if plan.offload_activations else ""
    red += " a2a-overlap" if plan.moe_a2a_overlap else ""
    red += f" runtime={plan.runtime}" if plan.runtime != "autoplan" else ""
    red += f" hsdp={plan.dp_replicate}x{plan.dp // plan.dp_replicate}" if plan.dp_replicate > 1 else ""
    red += local_sgd.describe_local_sgd(plan)
    red += f" steps={plan.schedule_steps}" if plan.schedule_steps > 1 else ""  # schedule steps of m / k each
    rc = describe_counts(plan.recompute, plan.recompute_blocks)
    return (
        f"dp={plan.dp}{ep} tp={plan.tp} pp={plan.pp} mbs={plan.micro_batch_size}x{plan.num_microbatches} "
        f"{plan.schedule}{v} zero={plan.zero_stage} rc={rc}{sp} {plan.precision}{red}"
    )
