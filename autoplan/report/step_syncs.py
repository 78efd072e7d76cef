"""The dp terms of a step of ``schedule_steps`` k (Plan.schedule_steps; docs/cost-model.md "Schedule steps") split
into what each schedule step sends and what the optimizer step sends once, for the predicted trace
(report/step_layout.py).

The cost model prices each dp term of the k-step plan as A + k B (cost/dp/sync.py): B the once-a-schedule-step
messages (ZeRO-2/3's reduce-scatter after each step's last backward, ZeRO-3's first-forward gather, total and
exposed, each priced as one schedule step's), A the rest (the after-backward all-reduce or ZeRO-1 reduce-scatter,
the weight all-gather, the buffer broadcast, the experts' apart sync). The plan of one schedule step (m / k
micro-batches, ``schedule_step_plan``) prices the same term as A + B, so with W the plan's and S the step's:

    once A = (k S - W) / (k - 1)        per schedule step B = (W - A) / k

so that k B + A = W exactly (A clamped to [0, W] against rounding). At k = 1 everything is once, as priced.
"""

from __future__ import annotations

from dataclasses import dataclass

from autoplan.errors import AutoplanError
from autoplan.types.cost import Cost

#: the split terms, in this order: the dp sync's total and exposed seconds, ZeRO-3's exposed traffic
FIELDS = ("dp_comm_s", "dp_comm_exposed_s", "zero_comm_s")


@dataclass(frozen=True)
class Syncs:
    """Seconds of :data:`FIELDS`: sent in each schedule step, and once an optimizer step."""

    per_step: tuple[float, float, float]
    once: tuple[float, float, float]

    @property
    def per_step_hidden_s(self) -> float:
        """What each schedule step's sync hides under its last backward."""
        return max(0.0, self.per_step[0] - self.per_step[1])


def split_syncs(cost: Cost, step_cost: Cost | None, steps: int) -> Syncs:
    """``cost``'s :data:`FIELDS` split (module docstring); ``step_cost`` the Cost of one of its ``steps`` schedule
    steps (unused at one step)."""
    whole = tuple(getattr(cost, name) for name in FIELDS)
    if steps == 1:
        return Syncs(per_step=(0.0, 0.0, 0.0), once=whole)
    if step_cost is None:
        raise AutoplanError("a plan of several schedule steps is laid out with the Cost of one schedule step")
    one = tuple(getattr(step_cost, name) for name in FIELDS)
    once = tuple(max(0.0, min(w, (steps * s - w) / (steps - 1))) for w, s in zip(whole, one))
    return Syncs(per_step=tuple((w - a) / steps for w, a in zip(whole, once)), once=once)
