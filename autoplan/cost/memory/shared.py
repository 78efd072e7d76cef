"""What a stage's memory reads of its own totals and its schedule, computed once per stage: the search prices
thousands of plans on the same memoised stage totals (CostModel._stages), which differ in ZeRO, gradient sync
and the rest of what cost/memory/plan.py reads of the plan, not in these.

- :func:`held`: the micro-batches of activations a stage holds at its forward's end and in its backward, the
  output gradients it keeps from B to W, the boundary tensors its finished sends hold and the backward's
  transient bytes; it reads the stage and the plan's :func:`schedule_key` (schedule, pp, v, m, runtime, the
  all-to-all's overlap), nothing else of the plan;
- :func:`block_facts`: the last parameterised block's saved bytes, the most parameters (and trained ones) of a
  block; it reads the stage alone.

:class:`SharedStageMemo` memoises both on the stage's identity and that key. It holds each stage it was given,
so an id is never reused while its entry lives; it is sound only for totals never edited once made, which is
why PlanMemory.fill, fed the cost model's memoised stages, uses it and PlanMemory.stage_memory (which callers
give their own copies) does not (:class:`UnsharedStages`). tests/unit/cost/test_memory_shared.py changes each
field of the key and checks the memoised result follows it.
"""

from __future__ import annotations

from autoplan.cost.memory.in_flight_floor import schedule_key
from autoplan.cost.memory.replayed import replayed_held, replays_memory
from autoplan.cost.pp.schedule import in_flight_after_first_backward, in_flight_chunks
from autoplan.cost.pp.zero_bubble import pending_weight_grads
from autoplan.cost.stages import StageTotals
from autoplan.types.plan import Plan

Held = tuple[float, float, float, float, float]  # in flight, after the first backward, pending, sent bytes, T


def held(plan: Plan, index: int, stage: StageTotals) -> Held:
    """Micro-batches of activations stage ``index`` holds at its forward's end and in its backward, the
    output gradients it keeps from B to W (cost/pp/schedule.py, zero_bubble.py), the bytes its finished sends and
    receive slots hold (boundary tensors at D, gradients at D_g) and the backward's transient bytes; where torch's
    runtime runs the schedule, at the state of its replayed order holding the most bytes, already in the backward
    (cost/memory/replayed.py)."""
    if replays_memory(plan):
        most, pending, sent, loss = replayed_held(plan, index, stage)
        return most, most, pending, sent, max(stage.peak_block_bytes, loss)
    after = in_flight_after_first_backward(plan, index)
    return in_flight_chunks(plan, index), after, pending_weight_grads(plan, index), 0.0, stage.transient_bytes


def block_facts(stage: StageTotals) -> tuple[float, float, float]:
    """(saved bytes of the stage's last block with parameters, not the loss's; the most parameters of any of its
    blocks; the most trainable parameters of any), 0 where there is none."""
    blocks = [b for b in stage.blocks if b.param_count and not b.loss_grad_bytes]
    return (
        blocks[-1].saved_bytes if blocks else 0.0,
        max((b.param_count for b in stage.blocks), default=0.0),
        max((b.trainable_param_count for b in stage.blocks), default=0.0),
    )


class UnsharedStages:
    """:func:`held` and :func:`block_facts` computed at each call: for stage totals a caller may edit."""

    def held(self, plan: Plan, index: int, stage: StageTotals, key: tuple | None = None) -> Held:
        return held(plan, index, stage)

    def blocks(self, stage: StageTotals) -> tuple[float, float, float]:
        return block_facts(stage)


class SharedStageMemo:
    """:func:`held` and :func:`block_facts` memoised on the stage's identity (module docstring)."""

    def __init__(self) -> None:
        self._held: dict[tuple, tuple[StageTotals, Held]] = {}
        self._blocks: dict[int, tuple[StageTotals, tuple[float, float, float]]] = {}

    def held(self, plan: Plan, index: int, stage: StageTotals, key: tuple | None = None) -> Held:
        """``key``: ``schedule_key(plan)``, where the caller took it once for all its stages."""
        key = (id(stage), index, schedule_key(plan) if key is None else key)
        if (hit := self._held.get(key)) is None or hit[0] is not stage:
            self._held[key] = hit = (stage, held(plan, index, stage))
        return hit[1]

    def blocks(self, stage: StageTotals) -> tuple[float, float, float]:
        if (hit := self._blocks.get(id(stage))) is None or hit[0] is not stage:
            self._blocks[id(stage)] = hit = (stage, block_facts(stage))
        return hit[1]


StageFacts = UnsharedStages | SharedStageMemo  # where PlanMemory takes a stage's held counts and block facts
