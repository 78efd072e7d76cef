"""Which pipeline schedules a plan may name, and the micro-batch and chunk counts each runs with
(docs/plan-format.md, "Pipeline schedules"; the prices: docs/cost-model.md, "Zero-bubble schedules").

- "gpipe", "1f1b": one chunk per stage (Huang et al. 2019; Narayanan et al. SC'21 section 2.2);
- "interleaved_1f1b": v >= 2 chunks per stage, looping placement (Narayanan et al. SC'21 section 2.2);
- "interleaved_zb": torch's ``ScheduleInterleavedZeroBubble`` (Qi et al. ICLR'24, "ZB1P"): each
  backward split into input gradients (B) and weight gradients (W), the W deferred into the bubble;
  v >= 1 chunks per stage, looping placement (v = 1 is ZB-H1: torch runs it with one stage per rank).
  It needs m >= p micro-batches (with fewer, torch's schedule idles longer than its priced bubble), and
  torch groups them into ``max(1, m // p)`` rounds of equal size, so that count must divide m.
"""

from __future__ import annotations

from typing import Any

from autoplan.errors import PlanError

SCHEDULES = ("gpipe", "1f1b", "interleaved_1f1b", "interleaved_zb")
#: the schedules that run more than one chunk per stage (``Plan.virtual_stages`` > 1)
MULTI_CHUNK = ("interleaved_1f1b", "interleaved_zb")
#: the schedules that split the backward into B and W (cost/pp/split_backward.py)
ZERO_BUBBLE = ("interleaved_zb",)


def zero_bubble_rounds(*, pp: int, num_microbatches: int) -> int:
    """The rounds torch's zero-bubble schedules group micro-batches into: max(1, m // p)."""
    return max(1, num_microbatches // pp)


def check_schedule(plan: Any) -> None:
    """The plan's schedule is known and runs its virtual stages and micro-batches (module docstring);
    one sentence naming the rule otherwise."""
    if plan.schedule not in SCHEDULES:
        raise PlanError(f"plan schedule='{plan.schedule}'; expected one of {', '.join(SCHEDULES)}.")
    if not (plan.virtual_stages == 1 or plan.schedule in MULTI_CHUNK):
        raise PlanError(
            f"plan virtual_stages={plan.virtual_stages} needs schedule "
            f"{' or '.join(repr(s) for s in MULTI_CHUNK)}, not '{plan.schedule}'."
        )
    if plan.schedule in ZERO_BUBBLE and plan.pp > 1:
        m = plan.num_microbatches
        if m < plan.pp:
            raise PlanError(
                f"plan schedule='{plan.schedule}' with pp={plan.pp} and num_microbatches={m}: a zero-bubble "
                "schedule fills the bubble with deferred weight gradients only with at least pp micro-batches; "
                "use more micro-batches or schedule '1f1b'."
            )
        rounds = zero_bubble_rounds(pp=plan.pp, num_microbatches=m)
        if m % rounds:
            raise PlanError(
                f"plan schedule='{plan.schedule}' with pp={plan.pp} and num_microbatches={m}: torch runs it in "
                f"{rounds} rounds of equal size (max(1, m // pp)), which must divide the micro-batches; use a "
                f"multiple of {rounds} or of pp."
            )
