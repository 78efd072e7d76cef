"""A plan as DeepSpeed's JSON config (``ds_config.json``), and such a config read back (the
plan-field-to-key table, what the writer avoids and why: docs/export-deepspeed.md, "The mapping").

DeepSpeed 0.19 reads the config in ``deepspeed.runtime.config.DeepSpeedConfig``; the tests load
every exported file with it and start the engine on every family. Pipeline fields, which
DeepSpeed takes in model code (``PipelineModule``), and the sentences of
:attr:`Exported.unexpressed` go in an ``"autoplan"`` section, which DeepSpeed ignores. Context
parallelism is DeepSpeed's Ulysses, ``sequence_parallel_size`` (any other variant is named:
DeepSpeed has none), read back as ulysses.
"""

from __future__ import annotations

import json
from typing import Any

from autoplan.export.activation_offload import activation_offload_notes
from autoplan.export.common import (
    Exported,
    ModelFacts,
    expert_layout_notes,
    layers_per_stage,
    refuse_schedule_steps,
    refuse_v_schedule,
    split_note,
)
from autoplan.export.deepspeed_read import SECTION, read
from autoplan.export.local_sgd import local_sgd_notes
from autoplan.export.offload import deepspeed_offload
from autoplan.export.recompute_budget import every_block_note
from autoplan.types.offload import one_rank_offload
from autoplan.types.plan import Plan

FILENAME = "ds_config.json"
__all__ = ["FILENAME", "SECTION", "export", "read"]
#: DeepSpeed's dynamic loss scaling for fp16: ``loss_scale: 0`` means dynamic, starting at 2**16.
FP16_DYNAMIC = {"enabled": True, "loss_scale": 0, "initial_scale_power": 16, "loss_scale_window": 1000,
                "hysteresis": 2, "min_loss_scale": 1}  # fmt: skip
#: ``deepspeed.checkpointing``'s options, left at DeepSpeed's defaults (nothing partitioned or offloaded).
CHECKPOINTING = {"partition_activations": False, "contiguous_memory_optimization": False, "cpu_checkpointing": False,
                 "number_checkpoints": None, "synchronize_checkpoint_boundary": False, "profile": False}  # fmt: skip


# ---- export -------------------------------------------------------------------------------
def export(plan: Plan, facts: ModelFacts) -> Exported:
    """``plan`` as a DeepSpeed JSON config (module docstring)."""
    refuse_v_schedule(plan, framework="DeepSpeed", runs="runs one chunk per stage (its 1F1B TrainSchedule)")
    refuse_schedule_steps(plan, framework="DeepSpeed")
    unexpressed = _unexpressed(plan, facts)
    config: dict[str, Any] = {
        **_batch(plan),
        "zero_optimization": _zero(plan),
        **_precision(plan),
        "communication_data_type": plan.grad_reduce_dtype,
        "data_types": {"grad_accum_dtype": grad_accum_dtype(plan)},
    }
    if plan.recompute != "none":
        config["activation_checkpointing"] = dict(CHECKPOINTING)
    if plan.tp > 1:
        config["tensor_parallel"] = {"autotp_size": plan.tp}
    if plan.ep > 1:
        config["expert_parallel"] = {"enabled": True, "autoep_size": plan.ep}
    if plan.cp > 1:  # DeepSpeed's Ulysses; the key sizes its data-parallel world, world / sp (DeepSpeedConfig)
        config["sequence_parallel_size"] = plan.cp
    deepspeed_offload(config, plan, zero_stage(plan), unexpressed)  # ZeRO-Offload (export/offload.py)
    config[SECTION] = _section(plan, facts, unexpressed)
    return Exported(
        framework="deepspeed",
        filename=FILENAME,
        text=json.dumps(config, indent=2) + "\n",
        unexpressed=unexpressed,
        launch=launch_command(plan),
    )


def launch_command(plan: Plan, *, devices_per_node: int = 8) -> str:
    """DeepSpeed's own launcher for this file (``devices_per_node`` GPUs a node, 8 unless told)."""
    per_node = min(plan.devices, devices_per_node)
    nodes = -(-plan.devices // per_node)
    return f"deepspeed --num_nodes {nodes} --num_gpus {per_node} train.py --deepspeed --deepspeed_config {FILENAME}"


def zero_stage(plan: Plan) -> int:
    """The ZeRO stage DeepSpeed runs: its PipelineEngine refuses ZeRO-2/3, so a pipeline gets ZeRO-1; ZeRO-Offload
    on one dp rank gets ZeRO-1 too (DeepSpeed offloads from stage 1 up; on one rank it shards nothing)."""
    if one_rank_offload(plan):
        return 1
    return min(plan.zero_stage, 1) if plan.pp > 1 else plan.zero_stage


def grad_accum_dtype(plan: Plan) -> str:
    """The dtype DeepSpeed accumulates gradients in: fp32, except without ZeRO under bf16/fp16, where
    ``DeepSpeedEngine._do_optimizer_sanity_check`` accepts only the model's own dtype (its
    FP16_Optimizer, or for a bf16 pipeline its BF16_Optimizer, which accumulates in fp32 anyway)."""
    if zero_stage(plan) > 0 or plan.precision == "fp32":
        return "fp32"
    return "fp16" if plan.precision == "fp16" else "bf16"  # fp8 trains the rest in bf16 (_precision)


def _batch(plan: Plan) -> dict[str, int]:
    # Under AutoTP DeepSpeedConfig would check train_batch_size against mbs·ga·(dp·tp) (module docstring).
    sizes = {
        "train_micro_batch_size_per_gpu": plan.micro_batch_size,
        "gradient_accumulation_steps": plan.num_microbatches,
    }
    return sizes if plan.tp > 1 else {"train_batch_size": plan.global_batch_size, **sizes}


def _zero(plan: Plan) -> dict[str, Any]:
    # Stage 0 has no overlap switch: DeepSpeed all-reduces after the backward (engine.allreduce_gradients).
    zero: dict[str, Any] = {"stage": zero_stage(plan)}
    if zero["stage"] > 0:
        zero["overlap_comm"] = plan.overlap_grad_reduce
    return zero


def _precision(plan: Plan) -> dict[str, Any]:
    if plan.precision in ("bf16", "fp8"):
        return {"bf16": {"enabled": True}}
    if plan.precision == "fp16":
        return {"fp16": dict(FP16_DYNAMIC)}
    return {}


def _section(plan: Plan, facts: ModelFacts, unexpressed: list[str]) -> dict[str, Any]:
    """What DeepSpeed's JSON cannot hold, for a reader (and :func:`read`); DeepSpeed ignores it."""
    return {
        "model": facts.name,
        "pp": plan.pp,
        "schedule": plan.schedule,
        "virtual_stages": plan.virtual_stages,
        "tp": plan.tp,
        "global_batch_size": plan.global_batch_size,
        "stages": plan.stages,
        "unexpressed": list(unexpressed),
    }


def _context_gaps(plan: Plan) -> list[str]:
    """DeepSpeed's one sequence-sharding form is Ulysses (all-to-all over heads), set up in model code."""
    if plan.cp == 1:
        return []
    found = [
        f"cp={plan.cp}: DeepSpeed's Ulysses is model code: UlyssesSPAttentionHF.register_with_transformers(..., "
        f"sequence_parallel_size={plan.cp}) returns the mpu to pass to deepspeed.initialize; this file's "
        "sequence_parallel_size only sizes the batch."
    ]
    if plan.cp_variant != "ulysses":
        found.append(
            f"cp={plan.cp} {plan.cp_variant}: DeepSpeed has no ring or all-gather context parallelism; written as "
            "its Ulysses (all-to-all over heads), which moves other bytes than autoplan priced."
        )
    return found


def _unexpressed(plan: Plan, facts: ModelFacts) -> list[str]:
    found = _pipeline_gaps(plan, facts) + _tensor_gaps(plan) + _context_gaps(plan)
    found += expert_layout_notes(plan, "DeepSpeed")
    found += activation_offload_notes(plan, "DeepSpeed")
    found += local_sgd_notes(plan, "DeepSpeed")
    if grad_accum_dtype(plan) != "fp32" and not (plan.pp > 1 and plan.precision != "fp16"):
        found.append(
            f"zero_stage=0 with {plan.precision}: DeepSpeed without ZeRO holds and accumulates gradients in the "
            f"training dtype ({grad_accum_dtype(plan)}; fp32 accumulation needs ZeRO-1 or more), so gradient memory "
            "is half what autoplan priced, and long accumulation loses precision."
        )
    if plan.zero_stage == 0 and plan.overlap_grad_reduce and plan.dp > 1:
        found.append(
            "overlap_grad_reduce: DeepSpeed without ZeRO all-reduces gradients after the backward at the "
            "accumulation boundary; it has no switch to overlap them with the backward (ZeRO-1+ has overlap_comm)."
        )
    if plan.recompute != "none":
        found.append(
            "recompute: DeepSpeed's checkpointing is invoked by model code (deepspeed.checkpointing.checkpoint "
            "around each block, or PipelineModule(activation_checkpoint_interval=1)); the config only sets its "
            "options."
        )
    if plan.recompute_blocks:
        how = "checkpoints the blocks model code wraps in deepspeed.checkpointing.checkpoint"
        found.append(every_block_note(plan, trainer="DeepSpeed", how=how))
    if plan.recompute == "selective":
        found.append(
            "recompute=selective (attention only) has no DeepSpeed equivalent; checkpointing whole blocks is "
            "full recompute, which costs more compute."
        )
    if plan.precision == "fp8":
        found.append(
            "precision=fp8: DeepSpeed's FP8 goes through Transformer Engine layers in model code; the config "
            "says bf16 for everything else."
        )
    if plan.dp_replicate > 1:
        found.append(
            f"dp_replicate={plan.dp_replicate} (HSDP): DeepSpeed has no replicated ZeRO groups (ZeRO++'s hpZ, "
            "zero_hpz_partition_size, only keeps a second weight copy per node); written as ZeRO over all "
            f"{plan.dp} data-parallel ranks, whose all-gathers and memory differ from the priced ones."
        )
    if plan.grad_compression == "powersgd":
        found.append(
            f"grad_compression=powersgd (rank {plan.powersgd_rank}) has no DeepSpeed switch; its compressed "
            "optimizers (1-bit Adam, 0/1 Adam) are different algorithms."
        )
    if plan.grad_compression == "topk":
        found.append(
            f"grad_compression=topk (ratio {plan.topk_ratio:g}) has no DeepSpeed switch: its compressed optimizers "
            "(1-bit Adam, 0/1 Adam, 1-bit LAMB) quantise to signs, they do not send the top-k entries."
        )
    return found


def _pipeline_gaps(plan: Plan, facts: ModelFacts) -> list[str]:
    if plan.pp == 1:
        return []
    blocks = f"its {facts.layers} blocks" if facts.layers else "its blocks"
    found = [
        f"pp={plan.pp}: DeepSpeed's JSON has no pipeline degree; build the model as deepspeed.pipe.PipelineModule("
        f"layers=..., num_stages={plan.pp}, partition_method='uniform') over {blocks} and train it with "
        "engine.train_batch()."
    ]
    if plan.stages and not layers_per_stage(plan):
        sizes = [len(stage) for stage in plan.stages]
        found.append(
            f"stages of {sizes} blocks: DeepSpeed's partition methods (uniform, parameters, type:REGEX) take no "
            "explicit split; the 'autoplan' section lists autoplan's."
        )
    if plan.zero_stage >= 2:
        found.append(
            f"zero_stage={plan.zero_stage} with pp={plan.pp}: DeepSpeed's PipelineEngine refuses ZeRO-2/3, so the "
            "config says ZeRO-1 (optimizer states sharded, gradients and weights not)."
        )
    if plan.schedule != "1f1b" or plan.virtual_stages > 1:
        found.append(
            f"schedule={plan.schedule} (virtual_stages={plan.virtual_stages}): DeepSpeed runs its one 1F1B "
            "TrainSchedule, one chunk per stage; it has no GPipe, interleaved or zero-bubble schedule."
        )
    return found


def _tensor_gaps(plan: Plan) -> list[str]:
    if plan.tp == 1:
        return []
    found = [
        f"tp={plan.tp}: written as tensor_parallel.autotp_size (DeepSpeed AutoTP training), which splits the "
        "model's linear layers by its own rules (Hugging Face models), not by autoplan's tp_plan.",
        f"train_batch_size is left out: under AutoTP DeepSpeed checks it against every rank, tp ranks included "
        f"(micro-batch x accumulation x {plan.devices // plan.pp} ranks), not the {plan.dp} data-parallel ranks; "
        f"the plan's global batch of {plan.global_batch_size} is in the 'autoplan' section.",
    ]
    note = split_note(plan)
    if note:
        found.append(note)
    if plan.sequence_parallel:
        found.append(
            "sequence_parallel (Megatron's, over the tp ranks) has no DeepSpeed switch; its sequence_parallel_size "
            "is Ulysses attention-head parallelism, a different scheme."
        )
    if plan.tp_comm_overlap:
        found.append("tp_comm_overlap has no DeepSpeed AutoTP switch; its collectives run unoverlapped.")
    return found
