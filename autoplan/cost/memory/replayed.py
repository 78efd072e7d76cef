"""A pipeline stage's activations, kept gradients and handed-on tensors at its peak, from its rank's replayed
order (cost/pp/rank_memory.py; docs/cost-model.md, "Pipeline memory").

Where torch's ``_PipelineScheduleRuntime`` runs the schedule (the V schedules always; interleaved_1f1b and
interleaved_zb under the runtimes that run torch's classes, types/schedules.py ``TORCH_PIPELINES``) a stage's
peak is the state of its order holding the most bytes, each chunk weighed by its own activations S_j and kept
gradients K_j (cost/stages.py ``chunk_saved_bytes``, ``chunk_held_bytes``):

    held    = sum_j h_j S_j / S      pending = sum_j k_j K_j / K      (S, K: the whole stage's, per micro-batch)

(j over the chunk groups of cost/pp/rank_memory.py ``chunk_groups``: the first chunk, the last, and the ones
between at their mean; the loss's chunk keeps K_j - X, X the loss's saved tensors, which torch's split backward
frees at B: ``StageTotals.loss_saved_bytes``) in units of the whole stage's micro-batch, as
cost/memory/per_device.py's moments take them, ``sent`` boundary tensors D and ``grads`` gradients of them D_g
(cost/stages.py ``held_boundary_bytes``: inputs and outputs, input and output gradients; with the slots), and the
loss's gradients only where the state is the loss's backward (a recomputed block's transient, cost/stages.py
``peak_block_bytes``, counts at every state). Megatron-Core and DeepSpeed run their own schedules, which wait
each send at once: their closed forms (cost/pp/schedule.py, zero_bubble.py) stay.
"""

from __future__ import annotations

from autoplan.cost.pp.rank_memory import chunk_groups, group_sizes, peak_state, rank_floors, row_matrix
from autoplan.cost.pp.receive_slots import held_bytes as boundary_held_bytes
from autoplan.cost.stages import StageTotals
from autoplan.cost.stored import stored
from autoplan.types.plan import Plan
from autoplan.types.schedules import RUNTIME_SCHEDULES, TORCH_PIPELINES, V_SCHEDULES


def replays_memory(plan: Plan) -> bool:
    """Whether ``plan``'s stages peak as their replayed orders say (module docstring)."""
    torch_runs = plan.schedule in RUNTIME_SCHEDULES and plan.runtime in TORCH_PIPELINES
    return plan.pp > 1 and (plan.schedule in V_SCHEDULES or torch_runs)


def _key(plan: Plan, index: int) -> dict:
    return dict(
        schedule=plan.schedule, pp=plan.pp, virtual_stages=plan.virtual_stages, m=plan.num_microbatches, rank=index
    )


def _per_group(plan: Plan, index: int, by_chunk: dict[int, float], total: float) -> tuple[list[float], tuple]:
    """Each chunk group's bytes of one of its chunks (rank_memory.py ``chunk_groups``: the middle chunks' mean)
    and the chunks in each group; an even share of ``total`` where the stage has no split (a StageTotals built
    without chunks)."""
    pairs, sizes = _groups(plan.schedule, plan.pp, plan.virtual_stages, index)
    if not by_chunk:
        return [total / len(pairs)] * len(sizes), sizes
    sums = [0.0] * len(sizes)
    for chunk, g in pairs:
        sums[g] += by_chunk.get(chunk, 0.0)
    return [b / n for b, n in zip(sums, sizes)], sizes


@stored(maxsize=4096)
def _groups(schedule: str, pp: int, virtual_stages: int, rank: int) -> tuple[tuple[tuple[int, int], ...], tuple]:
    """rank_memory.py ``chunk_groups`` as (chunk, group) pairs in its order, and ``group_sizes``, memoised on
    positional arguments: a search reads them for each stage whose held counts it prices."""
    where = dict(schedule=schedule, pp=pp, virtual_stages=virtual_stages, rank=rank)
    return tuple(chunk_groups(**where).items()), group_sizes(**where)


def replayed_held(plan: Plan, index: int, stage: StageTotals) -> tuple[float, float, float, float]:
    """(held, pending, the bytes of the boundary tensors and gradients sent and in receive slots, the loss's
    gradients alive) of stage ``index`` at its state holding the most bytes (module docstring)."""
    saved, _ = _per_group(plan, index, stage.chunk_saved_bytes, stage.saved_bytes)
    kept, sizes = _per_group(plan, index, stage.chunk_held_bytes, stage.wgrad_held_bytes)
    kept[-1] = max(0.0, kept[-1] - stage.loss_saved_bytes)  # the loss's chunk, last: its saved tensors freed at B
    tensors, grads = stage.held_boundary_bytes
    weights = (*saved, *kept, tensors, grads, stage.loss_grad_bytes)
    state = _peak((plan.schedule, plan.pp, plan.virtual_stages, plan.num_microbatches, index), weights)
    g, v = len(saved), plan.virtual_stages
    held_bytes = sum(n * s for n, s in zip(state[:g], saved))
    kept_bytes = sum(n * k for n, k in zip(state[g : 2 * g], kept))
    held = held_bytes / stage.saved_bytes if stage.saved_bytes else sum(state[:g]) / v
    pending = kept_bytes / stage.wgrad_held_bytes if stage.wgrad_held_bytes else sum(state[g : 2 * g]) / v
    sent = boundary_held_bytes(state[2 * g], state[2 * g + 1], boundary_bytes=tensors, grad_bytes=grads)
    return held, pending, sent, stage.loss_grad_bytes * state[2 * g + 2]


@stored(maxsize=65536)
def _peak(key: tuple, weights: tuple[float, ...]) -> tuple[int, ...]:
    """:func:`peak_state` of the states of ``key`` (schedule, pp, v, m, rank), memoised: the search prices
    many plans on the same stage totals. It reads the rank's rows (rank_memory.py ``row_matrix``), whose frontier's
    peak it is, without building that frontier. Where D_g = D, of the merged rows (order_states.py ``merge_sent``),
    their merged count returned as sent, with no gradients apart: held_bytes weighs it n D_g + n (D - D_g) = n D."""
    schedule, pp, v, m, rank = key
    merged = weights[-3] == weights[-2]
    rows, matrix = row_matrix(schedule=schedule, pp=pp, virtual_stages=v, m=m, rank=rank, merged=merged)
    g = (len(weights) - 3) // 2
    state = peak_state(rows, saved_bytes=weights[:g], kept_bytes=weights[g : 2 * g], boundary_bytes=weights[-3],
                       grad_bytes=weights[-2], loss_bytes=weights[-1], matrix=matrix)  # fmt: skip
    return (*state[:-2], state[-2], 0, state[-1]) if merged else state


def held_floor(plan: Plan, index: int) -> tuple[float, float]:
    """Micro-batches of the whole stage (activations, kept gradients) stage ``index`` holds at least at its
    peak, whatever its chunks weigh: at the state holding the most chunks (of those, the most kept gradients),
    the fewest any chunk group holds per chunk (the search's memory floor, cost/memory/in_flight_floor.py)."""
    return rank_floors(**_key(plan, index)).held_floor


def most_sent(plan: Plan, index: int) -> tuple[int, int]:
    """The most boundary tensors and gradients together, and the most boundary tensors, stage ``index`` holds at
    once over its replayed states (its finished sends and receive slots): its peak state holds at least their bytes
    at D_g each, and the second's at D each (the search's memory floor, cost/memory/sent_floor.py)."""
    return rank_floors(**_key(plan, index)).most_sent


def sent_at_held_floor(plan: Plan, index: int) -> tuple[int, int]:
    """The boundary tensors and gradients together, and the tensors, that stage ``index`` holds at a state with
    :func:`held_floor`'s counts (the most such): its peak holds at least the first at D_g and the second's excess
    at D - D_g beside held_floor's activations (the search's memory floor, cost/memory/in_flight_floor.py)."""
    return rank_floors(**_key(plan, index)).sent_at_held
