"""An overlapped F&B pair drawn as it runs (docs/report.md, "The predicted trace"): DualPipeV's pair under
``moe_a2a_overlap``, the forward of one chunk's micro-batch beside the backward of the rank's other chunk's
(autoplan/execute/overlap_f_b.py runs the halves on two threads, each all-to-all on its own lane).

The pair takes its priced time (cost/moe/a2a_overlap.py): per MoE layer four phases, in each one half computes
``k`` while the other half's all-to-all sends ``c``, and the phase adds ``exposed(c, k)`` to the compute:

    phase 1  F attention (forward half)  | combine's gradient (backward half's all-to-all)
    phase 2  B experts   (backward half) | dispatch           (forward half's)
    phase 3  F experts   (forward half)  | dispatch's gradient (backward half's)
    phase 4  B attention (backward half) | combine            (forward half's)

On the stage's compute thread the halves' pieces alternate ("F mb3 c0", "B mb1 c3", ...), so the two halves'
spans overlap in time; on the "ep" thread each all-to-all is drawn beside the other half's compute, its hidden
part ``c - exposed`` (category "hidden") from the phase's start and its exposed part after the compute. Then each
half's compute outside the MoE layers (the stage's other nodes, recomputation); the backward half's compute is
drawn as its input gradients ("B") then its weight gradients ("W") by their priced shares. Then each half's
exposed tp and cp seconds, and its pipeline send: the pair's window in
report/timeline.py's simulation, F + B + the phases' exposed seconds + the rest, per chunk (1/v of the stage).
"""

from __future__ import annotations

from autoplan.report.step_layout import Span
from autoplan.types.layout import chunk_index, sent_from_prior
from autoplan.types.schedules import v_shaped
from autoplan.types.trace_names import chunk_name


def pair_saved_s(phases: list, *, v: int) -> float:
    """What a pair's overlap takes off its two halves run apart with every all-to-all exposed: the phases'
    all-to-all seconds less their exposed ones, per chunk."""
    return sum(p.comm_s - p.exposed_s for p in phases) / v


def pair_spans(trio: list, pieces, phases: list, *, plan, send_s: float) -> list[Span]:
    """The spans of one pair (module docstring): ``trio`` its forward, backward and weight segments (timeline.py),
    ``pieces`` the stage's StagePieces (step_layout.py), ``phases`` its a2a_pair_phases."""
    forward, backward, weight = trio
    v, p, shape = plan.virtual_stages, plan.pp, v_shaped(plan.schedule)
    chunks = {seg.kind: chunk_index(stage=seg.stage, local=seg.chunk, pp=p, v_shape=shape) for seg in trio}
    names = {seg.kind: chunk_name(seg.kind, seg.microbatch, chunks[seg.kind]) for seg in trio}
    stage, end = forward.stage, weight.end_s
    spans: list[Span] = []
    cursor = forward.start_s

    def put(thread: str, name: str, seconds: float, category: str) -> None:
        nonlocal cursor
        dur = max(0.0, min(seconds, end - cursor))  # a stage lighter than the pace leaves the rest as bubble
        if dur > 0:
            spans.append(Span(stage, thread, name, cursor, dur, category))
        cursor += dur

    weight_share = pieces.weight_s / pieces.backward_s if pieces.backward_s > 0 else 0.0

    def compute(half: str, seconds: float) -> None:
        """A half's compute; the backward half's as its input then its weight gradients, by their priced shares."""
        if half == "forward":
            put("compute", names["forward"], seconds, "forward")
            return
        put("compute", names["backward"], seconds * (1.0 - weight_share), "backward")
        put("compute", names["weight"], seconds * weight_share, "weight")

    for phase in phases:
        other = "backward" if phase.half == "forward" else "forward"
        hidden = min(phase.comm_s - phase.exposed_s, phase.compute_s) / v
        if hidden > 0:
            spans.append(Span(stage, "ep", f"ep all-to-all {names[other]}", cursor, hidden, "hidden"))
        compute(phase.half, phase.compute_s / v)
        put("ep", f"ep all-to-all {names[other]}", phase.exposed_s / v, "exposed")
    for half, total_s in (("forward", pieces.forward_s), ("backward", pieces.backward_s)):
        compute(half, (total_s - sum(ph.compute_s for ph in phases if ph.half == half)) / v)
    for kind, share in (("forward", pieces.fwd_share), ("backward", 1.0 - pieces.fwd_share)):
        for dim in ("tp", "cp"):
            put(dim, f"{dim} {names[kind]}", pieces.exposed_s[dim] * share / v, "exposed")
    last = p * v - 1
    if chunks["forward"] < last and sent_from_prior(chunks["forward"] + 1, pp=p, v_shape=shape) and send_s > 0:
        put("pp", f"send activation {names['forward']}", send_s, "exposed")
    if chunks["backward"] > 0 and sent_from_prior(chunks["backward"], pp=p, v_shape=shape) and send_s > 0:
        put("pp", f"send gradient {names['backward']}", send_s, "exposed")
    return spans
