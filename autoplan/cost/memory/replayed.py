"""A pipeline stage's activations, kept gradients and handed-on tensors at its peak, from its rank's replayed
order (cost/pp/rank_memory.py; docs/cost-model.md, "Pipeline memory").

Where torch's ``_PipelineScheduleRuntime`` runs the schedule (the V schedules always; interleaved_1f1b and
interleaved_zb under the runtimes that run torch's classes, types/schedules.py ``TORCH_PIPELINES``) a stage's
peak is the state of its order holding the most bytes, each chunk weighed by its own activations S_j and kept
gradients K_j (cost/stages.py ``chunk_saved_bytes``, ``chunk_held_bytes``):

    held    = sum_j h_j S_j / S      pending = sum_j k_j K_j / K      (S, K: the whole stage's, per micro-batch)

in units of the whole stage's micro-batch, as cost/memory/per_device.py's moments take them, ``sent``
boundary tensors, and the loss's gradients only where the state is the loss's backward (a recomputed block's
transient, cost/stages.py ``peak_block_bytes``, counts at every state). Megatron-Core and DeepSpeed run
their own schedules, which wait each send at once: their closed forms (cost/pp/schedule.py, zero_bubble.py)
stay.
"""

from __future__ import annotations

from autoplan.cost.pp.rank_memory import peak_state, rank_states
from autoplan.cost.stages import StageTotals
from autoplan.types.layout import chunks_of_stage
from autoplan.types.plan import Plan
from autoplan.types.schedules import RUNTIME_SCHEDULES, TORCH_PIPELINES, V_SCHEDULES


def replays_memory(plan: Plan) -> bool:
    """Whether ``plan``'s stages peak as their replayed orders say (module docstring)."""
    torch_runs = plan.schedule in RUNTIME_SCHEDULES and plan.runtime in TORCH_PIPELINES
    return plan.pp > 1 and (plan.schedule in V_SCHEDULES or torch_runs)


def _states(plan: Plan, index: int) -> tuple:
    return rank_states(
        schedule=plan.schedule, pp=plan.pp, virtual_stages=plan.virtual_stages, m=plan.num_microbatches, rank=index
    )


def _per_chunk(plan: Plan, index: int, by_chunk: dict[int, float], total: float) -> list[float]:
    """Each chunk of stage ``index``'s bytes, in the order of the chunks' indices; an even share of ``total``
    where the stage has no split (a StageTotals built without chunks)."""
    chunks = sorted(
        chunks_of_stage(index, pp=plan.pp, virtual_stages=plan.virtual_stages, v_shape=plan.schedule in V_SCHEDULES)
    )
    if not by_chunk:
        return [total / len(chunks)] * len(chunks)
    return [by_chunk.get(c, 0.0) for c in chunks]


def replayed_held(plan: Plan, index: int, stage: StageTotals) -> tuple[float, float, float, float]:
    """(held, pending, sent, the loss's gradients alive) of stage ``index`` at its state holding the most bytes
    (module docstring)."""
    saved = _per_chunk(plan, index, stage.chunk_saved_bytes, stage.saved_bytes)
    kept = _per_chunk(plan, index, stage.chunk_held_bytes, stage.wgrad_held_bytes)
    state = peak_state(
        _states(plan, index),
        saved_bytes=saved,
        kept_bytes=kept,
        boundary_bytes=stage.boundary_bytes,
        loss_bytes=stage.loss_grad_bytes,
    )
    v = len(saved)
    held_bytes = sum(n * s for n, s in zip(state[:v], saved))
    kept_bytes = sum(n * k for n, k in zip(state[v : 2 * v], kept))
    held = held_bytes / stage.saved_bytes if stage.saved_bytes else sum(state[:v]) / v
    pending = kept_bytes / stage.wgrad_held_bytes if stage.wgrad_held_bytes else sum(state[v : 2 * v]) / v
    return held, pending, float(state[2 * v]), stage.loss_grad_bytes * state[2 * v + 1]


def held_floor(plan: Plan, index: int) -> tuple[float, float]:
    """Micro-batches of the whole stage (activations, kept gradients) stage ``index`` holds at least at its
    peak, whatever its chunks weigh: at the state holding the most chunks, the fewest any chunk holds (the
    search's memory floor, cost/memory/in_flight_floor.py)."""
    v = plan.virtual_stages
    most = max(_states(plan, index), key=lambda state: (sum(state[:v]), sum(state[v : 2 * v])))
    return float(min(most[:v])), float(min(most[v : 2 * v]))
