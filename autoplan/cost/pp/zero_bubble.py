"""Zero-bubble schedules' bubble and activations in flight (docs/cost-model.md, "Zero-bubble schedules").

With p stages, v chunks per stage, m micro-batches, and one micro-batch's whole-stage times F (forward),
B (input gradients), W (weight gradients; cost/pp/split_backward.py), where 1F1B's bubble is
(p - 1)(F + B + W) / v, torch's ScheduleInterleavedZeroBubble (ZB1P) replays to (cost/pp/looped_replay.py)

    interleaved_zb:  bubble = (p - 1) max(F, B, F + B - W) / v         (without recomputation)

Qi et al. ICLR'24 section 2.1: ZB-H1's bubble (p - 1)(F + B - W), a third of 1F1B's at T_F = T_B = T_W, each
stage filling its p - 1 cool-down slots with deferred Ws; deepseek-ai/DualPipe's table writes it
(p - 1)(F + B - 2W) with B the whole backward (B + W here). A W above F or B leaves idle slots the Ws cannot fill.
Under recomputation the order is replayed with each backward pass's re-runs.

In flight: torch's stage_backward_input keeps the stage's autograd graph (every saved activation) until
the W of that micro-batch runs, and ZB1P starts the Ws only after (v - 1) r + p - 1 - stage warm-up
forwards and ``stage`` more 1F1B steps (r = m / max(1, m // p) micro-batches per round), so every stage
holds the same number of chunks of 1/v at its peak (1F1B: min(p - stage, m) micro-batches):

    in flight = min((v - 1) r + p, v m) / v micro-batches           (v = 1: min(p, m))

and at that peak stage s has run the B but not yet the W of s + 1 chunks, whose output gradients it keeps
(cost/pp/split_backward.py): (s + 1) / v of the stage's ``wgrad_held_bytes`` beside the activations.
Both hold for m >= p, which types/schedules.py requires (with fewer, torch's schedule idles longer).
"""

from __future__ import annotations

from autoplan.cost.pp.replay import held_at_peak
from autoplan.types.plan import Plan
from autoplan.types.schedules import V_SCHEDULES, ZERO_BUBBLE, zero_bubble_rounds


def zero_bubble_in_flight(*, pp: int, num_microbatches: int, virtual_stages: int) -> float:
    """Micro-batches of activations a zero-bubble schedule holds on every stage (module docstring)."""
    m, v = num_microbatches, virtual_stages
    per_round = m / zero_bubble_rounds(pp=pp, num_microbatches=m)
    return min((v - 1) * per_round + pp, v * m) / v


def pending_weight_grads(plan: Plan, stage: int) -> float:
    """Micro-batches (in units of the whole stage) whose B ``stage`` has run and whose W it has not, at its
    activation peak (module docstring; a V schedule's from its replay); 0 for a schedule that runs each
    backward whole."""
    if plan.schedule in V_SCHEDULES:  # the replay's count at its peak (cost/pp/replay.py)
        peak = held_at_peak(schedule=plan.schedule, pp=plan.pp, m=plan.num_microbatches, rank=stage)
        return peak[1] / plan.virtual_stages
    return (stage + 1) / plan.virtual_stages if plan.schedule in ZERO_BUBBLE and plan.pp > 1 else 0.0


def bubble_share(parts: list[tuple[float, float, float]]) -> float:
    """A floor on (T - 2W - R) / T of any stage built from ``parts`` ((time_s, wgrad_s, reruns_s) of each block,
    its time with the most re-runs any chunk makes and those re-runs, and of the outside nodes, R = 0): the least
    of the parts' own, as a stage's T - 2W - R is the sum of its parts' and its T at most theirs (a chunk re-runs
    a block at most that often; the offload copies, if any, add to both). T - 2W - R = F + B - W with B, W without
    their re-runs, which interleaved_zb's bubble is at least (p - 1)/v times (cost/pp/looped_replay.py)."""
    return min((max(0.0, 1.0 - (2.0 * w + r) / t) for t, w, r in parts if t > 0), default=0.0)
