"""A recompute budget (Plan.recompute_blocks: the first k blocks of each pipeline chunk recompute,
autoplan/types/recompute.py) in each trainer's terms, or the one sentence saying it cannot be said.

- Megatron-LM: ``--recompute-granularity full --recompute-method block --recompute-num-layers k``
  recomputes the first k layers of each pipeline chunk (its TransformerBlock per virtual stage), one k
  for all: a budget that differs per chunk is written as its largest count, and a note says so; its
  selective granularity has no count.
- torchtitan 0.2.x: ``selective_ac_option = "N"`` wraps every N-th block a process builds (a counter
  over its blocks, ``count % N == 0``), so a stage of L blocks recomputes floor(L / N): a budget is
  written that way when one N gives every chunk its count (v = 1, full recompute; the same price for
  identical blocks, not the same blocks), else as every block with a note; read back, N gives each chunk
  floor(L / N) (:func:`read_torchtitan_ac`). torchtitan 0.3's FullAC and
  SelectiveAC, Accelerate's ``fsdp_activation_checkpointing`` and DeepSpeed (model code calls its
  checkpoint) checkpoint every block they are given: a note says what is written.
docs/export.md, "Budgeted recompute".
"""

from __future__ import annotations

import re
from typing import Any

from autoplan.types.plan import Plan

Flags = list[tuple[str, object]]
BLOCK = re.compile(r"layers\.\d+")  # a block in torchtitan's module names (torchtitan.py:chunk_modules)


def budget_text(plan: Plan) -> str:
    """``recompute_blocks 2/1 (full)``: the budget as a note names it."""
    return f"recompute_blocks {'/'.join(map(str, plan.recompute_blocks))} ({plan.recompute})"


def megatron_flags(plan: Plan, notes: list[str]) -> Flags:
    """Megatron-LM's recompute flags for a budgeted plan (module docstring); ``notes`` gets what differs."""
    largest = max(plan.recompute_blocks)
    if plan.recompute == "selective":
        notes.append(
            f"{budget_text(plan)}: Megatron-LM's selective granularity has no layer count; written for every layer."
        )
        return [("--recompute-granularity", "selective")]
    if len(set(plan.recompute_blocks)) > 1:
        notes.append(
            f"{budget_text(plan)}: Megatron-LM's --recompute-num-layers is one count for every pipeline chunk; "
            f"written as the largest, {largest}, so the chunks budgeted fewer recompute more blocks than planned "
            "(slower, never more memory)."
        )
    if largest == 0:
        return []
    return [("--recompute-granularity", "full"), ("--recompute-method", "block"), ("--recompute-num-layers", largest)]


def layer_sac_option(plan: Plan, sizes: list[int] | None) -> int | None:
    """The N of torchtitan 0.2.x's ``selective_ac_option`` that recomputes each chunk's count of blocks
    (floor(size / N), module docstring), or None when no N does (or the chunks are unknown, interleaved,
    or the blocks recompute selectively)."""
    if plan.recompute != "full" or plan.virtual_stages > 1 or sizes is None:
        return None
    for every in range(1, max(sizes) + 2):
        if all(size // every == k for size, k in zip(sizes, plan.recompute_blocks)):
            return every
    return None


def torchtitan_toml_note(plan: Plan, every: int | None) -> str:
    """The note beside torchtitan 0.2.x's activation_checkpoint section for a budgeted plan."""
    if every is not None:
        return (
            f"{budget_text(plan)}: written as selective_ac_option = {every} (full AC on one block in every {every} "
            "of a stage): as many blocks per stage as planned, not the first ones (one price for identical blocks)."
        )
    return (
        f"{budget_text(plan)}: torchtitan 0.2.x recomputes every block, or every N-th (selective_ac_option), "
        f"and no N gives these counts; written as mode '{plan.recompute}' for every block (slower, never more memory)."
    )


def every_block_note(plan: Plan, *, trainer: str, how: str) -> str:
    """The note for a trainer that checkpoints every block it is given (module docstring)."""
    return (
        f"{budget_text(plan)}: {trainer} {how}, with no count of blocks; written as every block "
        "(slower, never more memory): recompute only the first k blocks of each stage to match the plan."
    )


def read_torchtitan_ac(ac: dict[str, Any], sizes: list[int] | None, unmapped: list[str]) -> dict[str, Any]:
    """torchtitan 0.2.x's ``[activation_checkpoint]`` as Plan fields: ``selective_ac_option = "N"``
    (N >= 2) fully recomputes floor(L / N) of each chunk's L blocks, a budget (module docstring), when
    the chunks' block counts ``sizes`` are known; "1" is every block, "op" op-level selective."""
    mode = ac.get("mode", "selective")
    if mode == "memory_budget":
        unmapped.append("activation_checkpoint mode memory_budget: autoplan does not price it; read as selective.")
        return {"recompute": "selective"}
    option = str(ac.get("selective_ac_option", "2"))
    if mode != "selective" or option == "op":
        return {"recompute": mode}
    if option == "1":
        return {"recompute": "full"}
    if sizes is None or not option.isdigit():
        unmapped.append(
            f"selective_ac_option = {option} (full AC on one block in every {option}) with blocks per stage "
            "unknown: read as selective."
        )
        return {"recompute": "selective"}
    return {"recompute": "full", "recompute_blocks": [size // int(option) for size in sizes]}


def torchtitan_chunk_sizes(par: dict[str, Any], chunks: int, layers: int | None) -> list[int] | None:
    """Blocks per pipeline chunk as torchtitan 0.2.x's ``[parallelism]`` states them (the inverse of
    autoplan/export/torchtitan_toml.py's ``_pipeline``): its module lists, else ``layers_per_stage`` m
    with the end chunks m - first and m - last, else the model's layers split evenly; None if unknown."""
    parts = par.get("module_fqns_per_model_part")
    if parts:
        return [sum(1 for name in part if BLOCK.fullmatch(name)) for part in parts]
    if layers is None:
        return None
    per = par.get("pipeline_parallel_layers_per_stage")
    if per is None or chunks == 1:
        return [layers // chunks] * chunks if layers % chunks == 0 else None
    first = par.get("pipeline_parallel_first_stage_less_layers", 1)
    last = par.get("pipeline_parallel_last_stage_less_layers", 1)
    return [per - first] + [per] * (chunks - 2) + [per - last]
