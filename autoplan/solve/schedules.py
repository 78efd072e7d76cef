"""Which pipeline schedules a group of the search offers (docs/ilp.md, section 4; the names and their
rules: autoplan/types/schedules.py):

- "1f1b" at ``pp = 1`` (no pipeline: the schedule is moot);
- else gpipe, and 1f1b (where torch's Schedule1F1B runs it, autoplan's executor and torchtitan, only with at
  least ``pp`` micro-batches: it refuses fewer; Megatron-Core and DeepSpeed run 1F1B on any count);
  interleaved 1F1B with ``v >= 2`` where ``pp * v`` divides the blocks and ``pp`` divides the micro-batch count
  (Megatron-LM's condition);
- "interleaved_zb" (torch's ScheduleInterleavedZeroBubble) at v = 1 and each v of interleaved 1F1B, where
  there are at least ``pp`` micro-batches and torch's rounds divide them (the executor completes torch's split
  backward where a stage sends a value made from weights alone: autoplan/execute/split_backward.py).
- "zbv" and "dualpipev" (torch's V schedules, v = 2) where the model has at least 2 pp blocks and there are
  at least 2 pp micro-batches, for a runtime that runs them (autoplan's executor and torchtitan, which run
  torch's classes; Megatron-Core and DeepSpeed have no V placement: docs/export.md), or under their pin
  (``--fix schedule=zbv`` or ``dualpipev``); they split the backward as interleaved_zb does (DualPipeV in
  its cool-down). docs/cost-model.md, "V schedules", has the audit that unpinned them.

A ``--fix schedule=...`` or ``v=...`` pin keeps only its options.
"""

from __future__ import annotations

from autoplan.types.schedules import TORCH_PIPELINES, V_SCHEDULES, zero_bubble_rounds

RUNS_V = TORCH_PIPELINES  # torch's V schedules run where its classes do


def schedule_options(
    *, pp: int, layers: int, num_microbatches: int, fixes: dict, runtime: str = "autoplan"
) -> list[tuple[str, int]]:
    """(schedule, virtual_stages) pairs."""
    if pp == 1:
        options = [("1f1b", 1)]
    else:
        runs_1f1b = num_microbatches >= pp or runtime not in TORCH_PIPELINES  # torch's 1F1B refuses m < pp
        options = [("gpipe", 1)] + [("1f1b", 1)] * runs_1f1b
        looped = [v for v in range(2, layers // pp + 1) if layers % (pp * v) == 0]
        if num_microbatches % pp == 0:
            options += [("interleaved_1f1b", v) for v in looped]
        options += zero_bubble_options(pp=pp, virtual=looped, num_microbatches=num_microbatches)
        if 2 * pp <= min(layers, num_microbatches):
            pinned = fixes.get("schedule") in V_SCHEDULES
            options += [(schedule, 2) for schedule in V_SCHEDULES if pinned or runtime in RUNS_V]
    if "schedule" in fixes:
        options = [o for o in options if o[0] == fixes["schedule"]] or (
            [(fixes["schedule"], 1)] if pp == 1 and fixes["schedule"] not in ("interleaved_1f1b", *V_SCHEDULES) else []
        )
    if "v" in fixes:
        options = [o for o in options if o[1] == fixes["v"]]
    return options


def zero_bubble_options(*, pp: int, virtual: list[int], num_microbatches: int) -> list[tuple[str, int]]:
    """("interleaved_zb", v) for v = 1 and each looped ``virtual`` count, where its micro-batches run it
    (types/schedules.py)."""
    m = num_microbatches
    if m < pp or m % zero_bubble_rounds(pp=pp, num_microbatches=m):
        return []
    return [("interleaved_zb", v) for v in (1, *virtual)]
