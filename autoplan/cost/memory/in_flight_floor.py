"""A floor on a plan's peak memory that counts the micro-batches its schedule keeps in flight (docs/ilp.md,
"Memory floor"), so the search sets aside, unpriced, a plan no partition can fit.

On every pipeline device k, CostModel's peak is at least its moment M2 (cost/memory/per_device.py stage_memory):

    peak >= W_k + G_k + O_k + n'_k S_k + p_k D_k

with n'_k the micro-batches device k holds after its first backward (cost/pp/schedule.py
in_flight_after_first_backward; zero-bubble's from cost/pp/zero_bubble.py), S_k its blocks' kept activations
per micro-batch, p_k the micro-batches whose W a zero-bubble schedule still owes (pending_weight_grads) and D_k
the output gradients its blocks keep from B to W (part of M2's transient bytes). The largest of the pp devices
is at least any weighted mean of them; weights 1 / (n'_k H), H = sum_k 1 / n'_k, and each block on some device,
give

    peak >= (sum_k states_k / max_k n'_k + sum_b s_b + min_k (p_k / n'_k) sum_b d_b) / H

where s_b, d_b are block b's kept activations under the plan's recompute and its kept output gradients (the
outside nodes' left out) and sum_k states_k at least the blocks' dense model states (model_states is linear in
the parameters): none depends on the partition. Where a stage's peak is its replayed order's
(cost/memory/replayed.py), n'_k and p_k are the fewest micro-batches any of its chunks holds at the state
holding the most (``held_floor``), whatever the chunks weigh: a V schedule's too (its device k holds chunks k and
2 pp - 1 - k, their blocks' S_k summed; peak_k >= W_k + G_k + O_k + n'_k S_k + p_k D_k as for the other replayed
orders, solve/stage_floor.py reads the same counts device by device). Until 2026-12 a V schedule had no floor here.
"""

from __future__ import annotations

from autoplan.cost.memory.per_device import model_states
from autoplan.cost.memory.replayed import held_floor, replays_memory
from autoplan.cost.pp.schedule import in_flight_after_first_backward
from autoplan.cost.pp.zero_bubble import pending_weight_grads
from autoplan.types.plan import Plan


def schedule_key(plan: Plan) -> tuple:
    """What :func:`schedule_weights` reads of ``plan``: its schedule, degrees, micro-batches and runtime, and
    whether its all-to-all is overlapped (one forward more in flight)."""
    return (plan.schedule, plan.pp, plan.virtual_stages, plan.num_microbatches, plan.runtime, plan.moe_a2a_overlap)


def schedule_weights(plan: Plan) -> tuple[float, float, float] | None:
    """(max_k n'_k, H = sum_k 1 / n'_k, min_k p_k / n'_k) of the module docstring; None where there is no floor
    (a device holding no micro-batch)."""
    if (counts := device_counts(plan)) is None:
        return None
    held = [n for n, _ in counts]
    return max(held), sum(1.0 / n for n in held), min(p / n for n, p in counts)


def device_counts(plan: Plan, *, every_schedule: bool = False) -> list[tuple[float, float]] | None:
    """(n'_k, p_k) of the module docstring for each pipeline device k: the micro-batches it holds after its first
    backward and those whose W it still owes (a replayed stage's, a V schedule's among them, ``held_floor``,
    whatever its chunks weigh); None where the harmonic floor has none (a device holding no micro-batch).
    ``every_schedule``: devices holding none as they are, for a floor read device by device (solve/stage_floor.py)."""
    replayed = replays_memory(plan)
    if replayed:
        counts = [held_floor(plan, k) for k in range(plan.pp)]
    else:
        counts = [(in_flight_after_first_backward(plan, k), pending_weight_grads(plan, k)) for k in range(plan.pp)]
    return counts if every_schedule or min(n for n, _ in counts) > 0 else None


def in_flight_floor_bytes(
    plan: Plan,
    *,
    block_params: float,
    trained: float,
    kept_bytes: float,
    wgrad_held_bytes: float = 0.0,
    weights: tuple[float, float, float] | None = None,
    experts_bytes: float = 0.0,
) -> float:
    """The module docstring's floor, bytes per device: ``block_params`` the blocks' dense parameters per device,
    ``trained`` the fewest of them trainable, ``kept_bytes`` every block's kept activations per micro-batch,
    ``wgrad_held_bytes`` every block's output gradients kept from B to W; ``weights``: :func:`schedule_weights`
    of ``plan`` (or of a plan of the same :func:`schedule_key`), computed here when not given; ``experts_bytes``
    the routed experts' states summed over the stages (experts_floor.py), part of sum_k states_k."""
    if (weights := weights or schedule_weights(plan)) is None:
        return 0.0
    most_held, harmonic, owed = weights
    states_bytes = blocks_states_bytes(plan, block_params=block_params, trained=trained) + experts_bytes
    return (states_bytes / most_held + kept_bytes + owed * wgrad_held_bytes) / harmonic


def blocks_states_bytes(plan: Plan, *, block_params: float, trained: float) -> float:
    """The model states of ``block_params`` parameters per device, ``trained`` of them trainable, under ``plan``'s
    precision, ZeRO and offload: at most sum_k states_k over the pp devices (model_states is linear)."""
    states = model_states(
        params=block_params,
        trainable=trained,
        precision=plan.precision,
        zero_stage=plan.zero_stage,
        dp=plan.dp * plan.cp,  # as Bounds.states_floor_bytes: the fewest bytes any of its ZeRO layouts holds
        pp=plan.pp,
        offload=plan.offload,
    )
    return states.weights_bytes + states.grads_bytes + states.optimizer_bytes
