"""A floor on a plan's peak memory that counts the micro-batches its schedule keeps in flight (docs/ilp.md,
"Memory floor"), so the search sets aside, unpriced, a plan no partition can fit. On every pipeline device k,
CostModel's peak is at least its moment M2 (cost/memory/per_device.py stage_memory):

    peak >= W_k + G_k + O_k + n'_k S_k + p_k D_k + T_k

n'_k: the micro-batches device k holds after its first backward (cost/pp/schedule.py, zero_bubble.py; a replayed
stage's, V schedules' too, the fewest any of its chunks holds at its fullest state, replayed.py ``held_floor``); S_k
its kept activations per micro-batch; p_k the micro-batches whose W it owes, D_k its kept output gradients; T_k
the bytes its backward re-makes of its largest recomputed block. Weights 1 / (n'_k H), H = sum_k 1 / n'_k, every
block on some device and every chunk holding one (solve/pipeline.py), give the weighted mean and the loss's device
L alone:

    peak >= (sum_k states_k / max_k n'_k + sum_b s_b + s_pre + s_post + min_k (p_k / n'_k) sum_b d_b) / H + C + R
    peak >= states(post) + n'_L s_post + C_L + R

s_b, d_b: block b's kept activations under the plan's recompute and kept output gradients; s_pre, s_post: the
saved activations of the nodes before the first block and after the last (never recomputed); sum_k states_k at
least the blocks' dense model states (model_states is linear); R = min_b r_b where every block recomputes (r_b its
saved bytes under full, dropped ones under selective; 0 under a budget or without recompute). None depends on the
partition. C: the boundary tensors a replayed device holds at its n'_k state (:func:`device_sent`), weighted alike.
Any weights summing to 1 bound the peak so: the floor takes the largest of these and :func:`_weightings`'. A plan of
one stage and one micro-batch, whose device holds none after its first backward, has its forward's end instead
(:func:`forward_end_floor`).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from autoplan.cost.memory.per_device import model_states
from autoplan.cost.memory.replayed import held_floor, replays_memory, sent_at_held_floor
from autoplan.cost.pp.schedule import in_flight_after_first_backward
from autoplan.cost.pp.zero_bubble import pending_weight_grads
from autoplan.types.hsdp import state_shards
from autoplan.types.plan import Plan
from autoplan.types.schedules import plan_last_stage


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


class HeldSent(NamedTuple):
    """What the floors read of a schedule beside :func:`schedule_weights` (:func:`held_sent`)."""

    loss_held: float  # n'_L: the micro-batches the loss's device holds after its first backward
    mean_sent: tuple[float, float]  # sum_k c_k / (n'_k H) of each device's c_k = :func:`device_sent`
    loss_sent: tuple[float, float]  # c_L
    #: (states, activations, owed, sent, tensors) coefficients of the other weightings, a row each (:func:`_weightings`)
    weightings: np.ndarray | None = None


def held_sent(plan: Plan) -> HeldSent:
    """:class:`HeldSent` of ``plan`` (the loss's device: types/schedules.py plan_last_stage, the last or 0 in a
    V; its loss chunk holds at least n'_L, ``held_floor``); zeros where :func:`device_counts` has no floor."""
    if (counts := device_counts(plan)) is None:
        return HeldSent(0.0, (0.0, 0.0), (0.0, 0.0))
    sent, harmonic = device_sent(plan), sum(1.0 / n for n, _ in counts)
    mean = tuple(sum(c[i] / (n * harmonic) for c, (n, _) in zip(sent, counts)) for i in range(2))
    last = plan_last_stage(plan)
    return HeldSent(counts[last][0], mean, sent[last], _weightings(counts, sent))


def _weightings(counts: list[tuple[float, float]], sent: list[tuple[int, int]]) -> np.ndarray | None:
    """The weightings w_k = beta / min(n_j, n'_k) of each device count n_j below the largest (whose weighting is the
    harmonic one, 1 / (n'_k H)), beta = 1 / sum_k 1 / min(n_j, n'_k) so they sum to 1: the least weight beta / n_j,
    the least of w_k n'_k beta, so the mean is at least beta (A / n_j + B) + D min_k w_k p_k + sum_k w_k C_k
    (A, B, D, C of the module docstring; n_j = min n'_k spreads the states evenly). Each as the coefficients of
    (A, B, D, C's tensors and gradients at D_g, its tensors at D - D_g), those another is at least dropped."""
    found = []
    for n in sorted({n for n, _ in counts})[:-1]:
        low = [min(n, held) for held, _ in counts]
        beta = 1.0 / sum(1.0 / m for m in low)
        owed = beta * min(p / m for (_, p), m in zip(counts, low))
        found.append((beta / n, beta, owed, *(beta * sum(c[i] / m for c, m in zip(sent, low)) for i in range(2))))
    kept = [w for w in found if not any(o != w and all(a >= b for a, b in zip(o, w)) for o in found)]
    return np.array(kept) if kept else None


def device_sent(plan: Plan) -> list[tuple[int, int]]:
    """Per device, the boundary tensors and gradients together, and the tensors, its replayed order holds at the
    state :func:`device_counts` reads (replayed.py ``sent_at_held_floor``); none where its memory is not replayed
    (torch's 1F1B and GPipe slots: sent_floor.py ``slots_bytes``)."""
    if not replays_memory(plan):
        return [(0, 0)] * plan.pp
    return [sent_at_held_floor(plan, k) for k in range(plan.pp)]


def sent_bytes(counts: tuple[float, float], boundary: tuple[float, float]) -> float:
    """The bytes of ``counts`` (tensors and gradients together, tensors: :func:`device_sent`) at ``boundary`` (D, D_g:
    the least input of a block after the first and its gradients; D_g <= D), as receive_slots.py held_bytes."""
    return counts[0] * boundary[1] + counts[1] * (boundary[0] - boundary[1])


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


class KeptBytes(NamedTuple):
    """What the floors read of a plan's activations per micro-batch (solve/stage_costs.py kept_bytes_total)."""

    blocks: float  # sum_b s_b: every block's kept until its backward (cost/pp/partition.py kept_bytes)
    owed: float  # sum_b d_b + d_post - X: kept from B to W, less the loss's saved X (freed at B: replayed.py)
    remade: float  # min_b r_b (every block recomputed: cost/stages.py peak_block_bytes)
    pre: float  # s_pre: the nodes before the first block, on device 0
    post: float  # s_post: the nodes after the last block, the loss's saved tensors among them


def activations_floor(
    plan: Plan, kept: KeptBytes, *, params: tuple[float, float], post: tuple[float, float], **weighted: Any
) -> float:
    """The largest of the module docstring's floors (the harmonic mean, :func:`_weightings`' means, the loss's device)
    and ``states``, plus R, bytes per device: ``params`` the blocks' (dense parameters
    per device, the fewest of them trainable), ``post`` the nodes' after the last block; ``weighted``: weights
    (:func:`schedule_weights`), held (:func:`held_sent`), boundary (D, D_g: :func:`sent_bytes`), experts_bytes
    (:func:`in_flight_floor_bytes`) and states (the fullest stage's states, at most its peak less R)."""
    remade = 0.0 if plan.recompute_blocks else kept.remade
    held, boundary, states = weighted.pop("held"), weighted.pop("boundary"), weighted.pop("states", 0.0)
    if weighted["weights"] is None:  # no device holds a micro-batch after its first backward
        return max(states, forward_end_floor(plan, kept, params=params[0] + post[0], trained=params[1]))
    mean = in_flight_floor_bytes(
        plan, block_params=params[0], trained=params[1], kept_bytes=kept.blocks + kept.pre + kept.post,
        wgrad_held_bytes=kept.owed, **weighted,
    ) + sent_bytes(held.mean_sent, boundary)  # fmt: skip
    if held.weightings is not None:  # A, B, D, C's two bytes per count of the other weightings
        whole = blocks_states_bytes(plan, block_params=params[0], trained=params[1]) + weighted.get("experts_bytes", 0)
        terms = (whole, kept.blocks + kept.pre + kept.post, kept.owed, boundary[1], boundary[0] - boundary[1])
        mean = max(mean, float((held.weightings @ np.array(terms)).max()))
    loss = blocks_states_bytes(plan, block_params=post[0], trained=post[1]) + held.loss_held * kept.post
    return max(states, mean, loss + sent_bytes(held.loss_sent, boundary)) + remade


def forward_end_floor(plan: Plan, kept: KeptBytes, *, params: float, trained: float) -> float:
    """The floor of a one-stage plan where the others have none (one micro-batch: no device holds one after its
    first backward, :func:`schedule_weights` None): its moment M1, the forward's end (cost/memory/per_device.py),

        peak >= W + O + s_pre + sum_b s_b + s_post + R

    ``params`` its dense parameters per device (``trained`` the fewest of them trainable), R as the module
    docstring's (the backward's transient T >= R). 0 for a pipeline."""
    if plan.pp > 1:
        return 0.0
    states = model_states(
        params=params, trainable=trained, precision=plan.precision, zero_stage=plan.zero_stage,
        dp=state_shards(plan), pp=1, offload=plan.offload,
    )  # fmt: skip
    remade = 0.0 if plan.recompute_blocks else kept.remade
    return states.weights_bytes + states.optimizer_bytes + kept.blocks + kept.pre + kept.post + remade


def blocks_states_bytes(plan: Plan, *, block_params: float, trained: float) -> float:
    """The model states of ``block_params`` parameters per device, ``trained`` of them trainable, under ``plan``'s
    precision, ZeRO and offload: at most sum_k states_k over the pp devices (model_states is linear)."""
    states = model_states(
        params=block_params,
        trainable=trained,
        precision=plan.precision,
        zero_stage=plan.zero_stage,
        dp=state_shards(plan),  # as Bounds.states_floor_bytes: the fewest bytes any of its ZeRO layouts holds
        pp=plan.pp,
        offload=plan.offload,
    )
    return states.total_bytes
