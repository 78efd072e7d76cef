"""Which pipeline schedules a plan may name, and the micro-batch and chunk counts each runs with
(docs/plan-format.md, "Pipeline schedules"; the prices: docs/cost-model.md, "Zero-bubble schedules").

- "gpipe", "1f1b": one chunk per stage (Huang et al. 2019; Narayanan et al. SC'21 section 2.2);
- "interleaved_1f1b": v >= 2 chunks per stage, looping placement (Narayanan et al. SC'21 section 2.2);
- "interleaved_zb": torch's ``ScheduleInterleavedZeroBubble`` (Qi et al. ICLR'24, "ZB1P"): each
  backward split into input gradients (B) and weight gradients (W), the W deferred into the bubble;
  v >= 1 chunks per stage, looping placement (v = 1 is ZB-H1: torch runs it with one stage per rank).
  It needs m >= p micro-batches (with fewer, torch's schedule idles longer than its priced bubble), and
  torch groups them into ``max(1, m // p)`` rounds of equal size, so that count must divide m.
- "zbv", "dualpipev": torch's ``ScheduleZBVZeroBubble`` (Qi et al. ICLR'24 section 6) and ``ScheduleDualPipeV``
  (deepseek-ai/DualPipe): exactly v = 2 chunks per stage in the V placement (types/layout.py: stage s runs
  chunks s and 2p - 1 - s), B and W apart; they need m >= 2p micro-batches (DualPipeV refuses fewer; ZBV's
  warm-up runs 2p - 1 forwards and torch drops the actions of the micro-batches it lacks).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from autoplan.errors import PlanError
from autoplan.types.layout import last_stage, stage_of_chunk

SCHEDULES = ("gpipe", "1f1b", "interleaved_1f1b", "interleaved_zb", "zbv", "dualpipev")
#: the V schedules: two chunks per stage in the V placement (types/layout.py), priced by replay (cost/pp/replay.py)
V_SCHEDULES = ("zbv", "dualpipev")
#: the schedules that run more than one chunk per stage (``Plan.virtual_stages`` > 1)
MULTI_CHUNK = ("interleaved_1f1b", "interleaved_zb", *V_SCHEDULES)
#: the looping schedules that split the backward into B and W, priced in closed form (cost/pp/zero_bubble.py)
ZERO_BUBBLE = ("interleaved_zb",)
#: every schedule that runs input and weight gradients apart (cost/pp/split_backward.py)
SPLIT_BACKWARD = (*ZERO_BUBBLE, *V_SCHEDULES)
#: the runtimes that run torch's pipeline schedule classes (torch.distributed.pipelining): its V schedules, its
#: 1F1B only at m >= pp, and its per-rank orders and buffers, which the memory prices (cost/pp/rank_memory.py)
TORCH_PIPELINES = ("autoplan", "torchtitan")
#: the schedules torch runs in ``_PipelineScheduleRuntime``, which waits its sends after the step's last action
RUNTIME_SCHEDULES = ("interleaved_1f1b", "interleaved_zb", *V_SCHEDULES)


def v_shaped(schedule: str) -> bool:
    """Whether ``schedule`` places its chunks in a V (types/layout.py) rather than looping."""
    return schedule in V_SCHEDULES


def plan_stage_of_chunk(plan: Any, chunk: int) -> int:
    """The stage of ``plan`` that runs chunk ``chunk``, in its schedule's placement (types/layout.py)."""
    return stage_of_chunk(chunk, pp=plan.pp, v_shape=v_shaped(plan.schedule))


def plan_chunk_stages(plan: Any, chunks: int) -> tuple[int, ...]:
    """:func:`plan_stage_of_chunk` of chunks 0 .. ``chunks`` - 1, the placement read once: memoised on what it
    reads, pp and whether the schedule is V-shaped (the search asks it of every member's stage totals)."""
    return chunk_stages(pp=plan.pp, v_shape=v_shaped(plan.schedule), chunks=chunks)


@lru_cache(maxsize=4096)
def chunk_stages(*, pp: int, v_shape: bool, chunks: int) -> tuple[int, ...]:
    """The stage of each of chunks 0 .. ``chunks`` - 1 (types/layout.py ``stage_of_chunk``)."""
    return tuple(stage_of_chunk(c, pp=pp, v_shape=v_shape) for c in range(chunks))


def plan_last_stage(plan: Any) -> int:
    """The stage of ``plan`` that runs its last chunk, the modules after the last block and the loss
    (types/layout.py: pp - 1, or stage 0 in a V)."""
    return last_stage(pp=plan.pp, virtual_stages=plan.virtual_stages, v_shape=v_shaped(plan.schedule))


def zero_bubble_rounds(*, pp: int, num_microbatches: int) -> int:
    """The rounds torch's zero-bubble schedules group micro-batches into: max(1, m // p)."""
    return max(1, num_microbatches // pp)


def _step_microbatches(plan: Any) -> tuple[int, str]:
    """(the micro-batches one schedule step runs, how a message names them): m, or m / k under
    ``schedule_steps`` k > 1 (types/schedule_steps.py, checked first)."""
    k = plan.schedule_steps
    if k == 1:
        return plan.num_microbatches, f"num_microbatches={plan.num_microbatches}"
    m = plan.num_microbatches // k
    return m, f"num_microbatches={plan.num_microbatches} in schedule_steps={k} ({m} per schedule step)"


def check_schedule(plan: Any) -> None:
    """The plan's schedule is known and runs its virtual stages and the micro-batches of one schedule
    step (module docstring); one sentence naming the rule otherwise."""
    if plan.schedule not in SCHEDULES:
        raise PlanError(f"plan schedule='{plan.schedule}'; expected one of {', '.join(SCHEDULES)}.")
    if not (plan.virtual_stages == 1 or plan.schedule in MULTI_CHUNK):
        raise PlanError(
            f"plan virtual_stages={plan.virtual_stages} needs schedule "
            f"{' or '.join(repr(s) for s in MULTI_CHUNK)}, not '{plan.schedule}'."
        )
    if plan.schedule in V_SCHEDULES:
        check_v_schedule(plan)
    if plan.schedule in ZERO_BUBBLE and plan.pp > 1:
        m, named = _step_microbatches(plan)
        if m < plan.pp:
            raise PlanError(
                f"plan schedule='{plan.schedule}' with pp={plan.pp} and {named}: a zero-bubble "
                "schedule fills the bubble with deferred weight gradients only with at least pp micro-batches; "
                "use more micro-batches or schedule '1f1b'."
            )
        rounds = zero_bubble_rounds(pp=plan.pp, num_microbatches=m)
        if m % rounds:
            raise PlanError(
                f"plan schedule='{plan.schedule}' with pp={plan.pp} and {named}: torch runs it in "
                f"{rounds} rounds of equal size (max(1, m // pp)), which must divide the micro-batches; use a "
                f"multiple of {rounds} or of pp."
            )


def check_v_schedule(plan: Any) -> None:
    """A V schedule runs two chunks per stage on a pipeline, with at least one micro-batch per chunk (module
    docstring); one sentence naming the rule otherwise."""
    name = plan.schedule
    if plan.virtual_stages != 2:
        raise PlanError(f"plan schedule='{name}' runs exactly 2 chunks per stage (a V); set virtual_stages=2.")
    if plan.pp < 2:
        raise PlanError(f"plan schedule='{name}' is a pipeline schedule; it needs pp >= 2, not pp={plan.pp}.")
    m, named = _step_microbatches(plan)
    if m < 2 * plan.pp:
        raise PlanError(
            f"plan schedule='{name}' with pp={plan.pp} and {named}: a V schedule "
            f"needs at least 2 * pp = {2 * plan.pp} micro-batches, one per chunk; use more micro-batches."
        )
