"""Which pipeline schedules a group of the search offers (docs/ilp.md, section 4; the names and their
rules: autoplan/types/schedules.py):

- "1f1b" at ``pp = 1`` (no pipeline: the schedule is moot);
- else gpipe and 1f1b; interleaved 1F1B with ``v >= 2`` where ``pp * v`` divides the blocks and ``pp``
  divides the micro-batch count (Megatron-LM's condition);
- "interleaved_zb" (torch's ScheduleInterleavedZeroBubble) at v = 1 and each v of interleaved 1F1B, where
  there are at least ``pp`` micro-batches and torch's rounds divide them (the executor completes torch's split
  backward where a stage sends a value made from weights alone: autoplan/execute/split_backward.py).

A ``--fix schedule=...`` or ``v=...`` pin keeps only its options.
"""

from __future__ import annotations

from autoplan.types.schedules import zero_bubble_rounds


def schedule_options(*, pp: int, layers: int, num_microbatches: int, fixes: dict) -> list[tuple[str, int]]:
    """(schedule, virtual_stages) pairs."""
    if pp == 1:
        options = [("1f1b", 1)]
    else:
        options = [("gpipe", 1), ("1f1b", 1)]
        looped = [v for v in range(2, layers // pp + 1) if layers % (pp * v) == 0]
        if num_microbatches % pp == 0:
            options += [("interleaved_1f1b", v) for v in looped]
        options += zero_bubble_options(pp=pp, virtual=looped, num_microbatches=num_microbatches)
    if "schedule" in fixes:
        options = [o for o in options if o[0] == fixes["schedule"]] or (
            [(fixes["schedule"], 1)] if pp == 1 and fixes["schedule"] != "interleaved_1f1b" else []
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
