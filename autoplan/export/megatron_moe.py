"""Megatron-LM's expert layout flags, written and read back (docs/export-megatron.md; docs/moe.md,
"Expert tensor parallelism").

Megatron-Core lays the MoE layers out as ``expert_tensor_parallel_size x expert_model_parallel_size x
expert data parallel`` over the ranks of a pipeline stage (MoE Parallel Folding), and takes
``expert_tensor_parallel_size = tensor_model_parallel_size`` when the flag is absent
(megatron/core/model_parallel_config.py, parallel_state.initialize_model_parallel). autoplan's default
is ``expert_tp = 1`` (types/expert_layout.py), so the exporter writes ``--expert-tensor-parallel-size``
for every MoE plan at tp > 1 or expert_tp > 1, and the reader takes Megatron's default for a MoE config
(``--num-experts``) without the flag. ``moe_a2a_overlap`` is ``--overlap-moe-expert-parallel-comm`` with the
alltoall token dispatcher it needs (Megatron's default is allgather), written only where Megatron-Core runs it
(types/moe_overlap.py), else a note.
"""

from __future__ import annotations

from typing import Any

from autoplan.export.common import ExportError
from autoplan.types.moe_overlap import megatron_refusal
from autoplan.types.plan import Plan

EXPERT_TP_FLAG = "--expert-tensor-parallel-size"
A2A_OVERLAP_FLAG, DISPATCHER_FLAG = "--overlap-moe-expert-parallel-comm", "--moe-token-dispatcher-type"
#: Megatron-Core's dispatchers that run the overlap (TransformerConfig.__post_init__)
OVERLAP_DISPATCHERS = ("alltoall", "flex")
MOE_VALUED, MOE_SWITCHES = {EXPERT_TP_FLAG, DISPATCHER_FLAG}, {A2A_OVERLAP_FLAG}  # what megatron_read.py reads


def expert_flags(plan: Plan) -> list[tuple[str, Any]]:
    """``--expert-model-parallel-size`` at ep > 1 and, for a Mixture-of-Experts plan at tp > 1 or
    expert_tp > 1, ``--expert-tensor-parallel-size`` (module docstring): stated even where it equals
    Megatron's default, so the file reads back without the model's ``--num-experts``."""
    flags: list[tuple[str, Any]] = [("--expert-model-parallel-size", plan.ep)] if plan.ep > 1 else []
    moe = plan.routing is not None or plan.ep > 1 or plan.expert_tp > 1
    if moe and (plan.tp > 1 or plan.expert_tp > 1):
        flags.append((EXPERT_TP_FLAG, plan.expert_tp))
    if plan.moe_a2a_overlap and not megatron_refusal(plan):
        flags += [(DISPATCHER_FLAG, "alltoall"), (A2A_OVERLAP_FLAG, None)]
    return flags


def overlap_notes(plan: Plan) -> list[str]:
    """What Megatron-LM cannot run of the plan's all-to-all overlap, one sentence (module docstring)."""
    why = megatron_refusal(plan) if plan.moe_a2a_overlap else ""
    return [f"moe_a2a_overlap: {why}; written without {A2A_OVERLAP_FLAG}, its all-to-all exposed."] if why else []


def read_experts(args: dict[str, Any], fields: dict[str, Any], read_int: Any) -> dict[str, Any]:
    """The plan's expert_tp (:func:`read_expert_tp`) and moe_a2a_overlap of Megatron arguments ``args``, refusing
    in one sentence the overlap Megatron-Core refuses: without expert parallelism or the alltoall/flex dispatcher."""
    overlap = A2A_OVERLAP_FLAG in args
    dispatcher = args.get(DISPATCHER_FLAG, "allgather")
    if overlap and (fields["ep"] <= 1 or dispatcher not in OVERLAP_DISPATCHERS):
        raise ExportError(
            f"{A2A_OVERLAP_FLAG} needs --expert-model-parallel-size > 1 and {DISPATCHER_FLAG} alltoall or flex "
            f"(Megatron-Core asserts both); the config has ep {fields['ep']} and the {dispatcher} dispatcher."
        )
    return {"expert_tp": read_expert_tp(args, fields, read_int), "moe_a2a_overlap": overlap}


def read_expert_tp(args: dict[str, Any], fields: dict[str, Any], read_int: Any) -> int:
    """The plan's expert_tp of Megatron arguments ``args`` (``read_int`` reads one integer flag): the flag,
    else Megatron's default, the ``fields``' tp, for a MoE config (``--num-experts``), else 1 (a dense model
    has no experts to split)."""
    if EXPERT_TP_FLAG in args:
        return read_int(args, EXPERT_TP_FLAG, 1)
    return fields["tp"] if "--num-experts" in args else 1


def expert_remarks(plan: Plan) -> list[str]:
    """What the user must add for the plan's expert layout: Megatron-Core runs expert_tp > 1 only without
    linear biases (TransformerConfig.__post_init__: "Bias in Moe is only supported when ETP==1"), and its
    GPT default has them, which its start-up check found (tests/unit/export/test_megatron.py)."""
    if plan.expert_tp == 1:
        return []
    return [
        f"--disable-bias-linear: expert_tp={plan.expert_tp} runs in Megatron-Core only without linear biases "
        "(it refuses 'Bias in Moe ... when ETP==1'); add it for a model without them, else plan expert_tp=1."
    ]
