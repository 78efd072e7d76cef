"""Budgeted recompute: the fewest blocks per pipeline chunk that must recompute for each stage to fit.

    k*_s = min { k : peak_s(k) <= M_usable },   k over 0..max chunk size on stage s

with peak_s(k) the stage's priced peak (cost/memory/plan.py) when each of its chunks recomputes its
first min(k, size) blocks (autoplan/types/recompute.py). Each stage's memory reads only its own
blocks, so the stages are solved together, one priced plan per probe. Recomputing the first block
trades its saved activations a for its input x but adds a transient a (the block re-run in the
backward, cost/stages.py), so k = 0 is tested alone; beyond it every block recomputed lowers the
peak by (a - x) times the micro-batches in flight, and k >= 1 is found by bisection (log2 L probes),
as Megatron-LM's ``--recompute-num-layers`` is chosen by hand to fill memory
(docs/cost-model.md, "Budgeted recompute").
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from autoplan.cost.memory.per_device import usable_bytes
from autoplan.cost.pp.schedule import balanced_stages
from autoplan.types.layout import stage_of_chunk
from autoplan.types.plan import Plan
from autoplan.types.schedules import v_shaped

if TYPE_CHECKING:
    from autoplan.cost.model import CostModel


def chunk_sizes(model: CostModel, plan: Plan) -> list[int]:
    """Blocks per pipeline chunk, as the cost model places them (plan.stages, or balanced)."""
    chunks = plan.stages or balanced_stages(model.graph.layers, plan.pp * plan.virtual_stages)
    return [len(chunk) for chunk in chunks]


def stage_peaks_bytes(model: CostModel, plan: Plan, counts: list[int]) -> list[float]:
    """Each stage's priced peak per device when chunk c recomputes its first ``counts[c]`` blocks."""
    budgeted = plan if list(counts) == plan.recompute_blocks else _with_counts(plan, counts)
    stages, _tp_plan, _ctx = model.priced_stages(budgeted)
    return [memory.peak_bytes for memory in model.stage_memory(budgeted, stages)]


def fit_recompute_blocks(model: CostModel, plan: Plan, *, fits: bool = False) -> list[int] | None:
    """Per chunk, the fewest leading blocks ``plan.recompute`` must cover for every stage to fit (module
    docstring); None when even every block recomputed does not fit or the plan recomputes nothing. ``fits``: the
    caller priced ``plan`` (every block recomputed, on its stages) and it fit, so that probe is not priced again."""
    if plan.recompute == "none":
        return None
    sizes = chunk_sizes(model, plan)
    limit = usable_bytes(model.profile.device.memory_bytes)
    top = [
        max(size for c, size in enumerate(sizes) if stage_of_chunk(c, pp=plan.pp, v_shape=v_shaped(plan.schedule)) == s)
        for s in range(plan.pp)
    ]
    if not fits and any(peak > limit for peak in stage_peaks_bytes(model, plan, sizes)):
        return None
    zero = stage_peaks_bytes(model, plan, [0] * len(sizes))
    low = [0 if zero[s] <= limit else 1 for s in range(plan.pp)]  # the smallest k that may fit
    high = [0 if zero[s] <= limit else top[s] for s in range(plan.pp)]  # one that fits
    while any(lo < hi for lo, hi in zip(low, high)):
        mid = [(lo + hi) // 2 for lo, hi in zip(low, high)]
        peaks = stage_peaks_bytes(model, plan, _per_chunk(mid, sizes, plan))
        for s in range(plan.pp):
            if low[s] < high[s]:
                low[s], high[s] = (low[s], mid[s]) if peaks[s] <= limit else (mid[s] + 1, high[s])
    return _per_chunk(high, sizes, plan)


def _per_chunk(per_stage: list[int], sizes: list[int], plan: Plan) -> list[int]:
    """A stage's count applied to each of its chunks, capped at the chunk's size."""
    return [
        min(per_stage[stage_of_chunk(c, pp=plan.pp, v_shape=v_shaped(plan.schedule))], size)
        for c, size in enumerate(sizes)
    ]


def _with_counts(plan: Plan, counts: list[int]) -> Plan:
    """``plan`` with recompute budget ``counts`` (validated as any plan is)."""
    return replace(plan, recompute_blocks=list(counts))
