"""The predicted step laid out in time from its priced terms: the spans of timeline.json (docs/report.md,
"The predicted trace"). Every stage's track ends at the priced step time T = sum of Cost.TIME_FIELDS:
    T = [compute + m tp_mb + ep + cp + bubble + pp]   (the pipeline, as the cost model paces it)
      + grad_accum + sp_sync + dp_exposed + compression + zero + optimizer   (the tail, in that order)

- Pacing: the cost model charges every stage the slowest stage's micro-batch (compute_s = m x slowest),
  so the schedule (report/timeline.py's order and dependencies) is simulated with every stage's chunk
  slot equal to the slowest's: F = its forward compute + the forward's share fwd/(fwd+bwd) of its
  exposed tp, cp and ep seconds, B the rest (a split-backward schedule's W its weight gradients), each
  slot also holding one pipeline send, pp_comm / (v m + p - 1) / 2 (cost/pp/messages.py prices
  v m + p - 1 slots of one activation and one gradient send on the critical path).
- In its slot a stage draws its own priced pieces, one after the other: the chunk's compute ("F mb3 c0"), its
  exposed tp, cp, ep seconds (each on its own thread), its send on "pp" when the chunk's output goes to another
  stage, the all-to-all the overlap hides "hidden" under the compute (DualPipeV's pairs: report/pair_layout.py).
- The bubble: the gaps of a stage's compute thread until the pipeline's priced end (compute + m tp_mb +
  ep + cp + bubble + pp); with uniform slots the schedule's own idle is (p - 1)/v slots (Narayanan et al.
  SC'21 section 2.2), and what the cost model prices beyond it (a zero-bubble closed form, the hidden
  all-to-all's share of the bubble) closes each stage's pipeline as one more "bubble".
- The tail, after the pipeline on every stage: the dp sync's exposed part (its hidden part ends with the stage's
  last backward, on "dp", category "hidden"), sequence parallelism's gradient all-reduce (tp_comm - m tp_mb),
  ZeRO-3's exposed traffic, gradient accumulation ((m - 1) adds, priced serially), compression, the optimizer.
- ``schedule_steps`` k: k pipelines of m / k end to end, each 1/k of the priced one and followed by its own
  dp syncs, then the tail (report/step_syncs.py; docs/report.md "The predicted trace").
A span's bytes are its stage's per-step bytes on that dimension (cost/volumes.py) shared by seconds.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from autoplan.cost import a2a_pair_phases, stage_rerun_units
from autoplan.report.step_syncs import Syncs, split_syncs
from autoplan.report.timeline import consecutive_steps, simulate
from autoplan.types.cost import Cost
from autoplan.types.layout import chunk_index, sent_from_prior
from autoplan.types.plan import Plan
from autoplan.types.schedule_steps import schedule_step_plan
from autoplan.types.schedules import SPLIT_BACKWARD, V_SCHEDULES, v_shaped
from autoplan.types.trace_names import LETTER, chunk_name


@dataclass
class Span:
    """One event of the trace: seconds from the step's start."""

    stage: int
    thread: str  # compute or one of COMM_THREADS
    name: str
    start_s: float
    dur_s: float
    category: str  # forward | backward | weight | bubble | exposed | hidden | tail
    args: dict = field(default_factory=dict)

    @property
    def end_s(self) -> float:
        return self.start_s + self.dur_s


@dataclass(frozen=True)
class StagePieces:
    """One stage's priced seconds per micro-batch (whole stage, all its chunks)."""

    forward_s: float
    backward_s: float  # compute, recomputation and host copies included; the weight part too
    weight_s: float  # of backward_s, what a split-backward schedule runs as W
    exposed_s: dict[str, float]  # tp, cp, ep seconds on the critical path
    hidden_ep_s: float  # the all-to-all the overlap hides under another micro-batch's compute
    fwd_share: float  # fwd / (fwd + bwd): the forward's share of the collectives (StageTotals.forward_s)


def stage_pieces(stage, *, ep_exposed_share: float, split: bool) -> StagePieces:
    """A priced StageTotals (cost/stages.py) as the pieces drawn per micro-batch."""
    compute = stage.fwd_s + stage.bwd_s
    ep_exposed = stage.ep_s * ep_exposed_share
    return StagePieces(
        forward_s=stage.fwd_s,
        backward_s=stage.bwd_s + stage.recompute_s + stage.offload_s,
        weight_s=stage.wgrad_s if split else 0.0,
        exposed_s={"tp": stage.tp_s, "cp": stage.cp_s, "ep": ep_exposed},
        hidden_ep_s=stage.ep_s - ep_exposed,
        fwd_share=stage.fwd_s / compute if compute else 0.0,
    )


def _slot(pieces: StagePieces, kind: str, *, v: int, send_s: float) -> tuple[float, list[tuple[str, float]]]:
    """(slot seconds with its send, the pieces drawn in it: (thread, seconds)) of one chunk of ``kind``."""
    comm = {"forward": pieces.fwd_share, "backward": 1.0 - pieces.fwd_share, "weight": 0.0}[kind]
    compute = {"forward": pieces.forward_s, "backward": pieces.backward_s - pieces.weight_s, "weight": pieces.weight_s}[
        kind
    ]
    drawn = [("compute", compute / v)] + [(dim, s * comm / v) for dim, s in pieces.exposed_s.items() if s * comm > 0]
    return sum(s for _, s in drawn) + (send_s if kind != "weight" else 0.0), drawn


def pipeline_end_s(cost: Cost, plan: Plan, slowest) -> float:
    """The pipeline's priced end: compute + m tp_mb + ep + cp + bubble + pp (module docstring)."""
    tp_mb = plan.num_microbatches * slowest.tp_s
    return cost.compute_s + tp_mb + cost.ep_comm_s + cost.cp_comm_s + cost.bubble_s + cost.pp_comm_s


def lay_out(
    plan: Plan, stages: list, cost: Cost, step_bytes: list[dict[str, float]], step_cost: Cost | None = None
) -> list[Span]:
    """Every span of ``plan``'s step (module docstring) from its priced stages (StageTotals), its Cost and
    each stage's per-step bytes per dimension; with ``schedule_steps`` k > 1, ``step_cost`` is the Cost of one
    schedule step (``schedule_step_plan``), which splits the dp terms into per-step and once (:func:`split_syncs`)."""
    from autoplan.report.pair_layout import pair_saved_s, pair_spans  # it draws this module's Spans

    k, step = plan.schedule_steps, schedule_step_plan(plan)
    m, p, v, schedule = step.num_microbatches, plan.pp, plan.virtual_stages, plan.schedule  # m of one schedule step
    slowest = max(stages, key=lambda s: s.micro_batch_s)
    pairs = plan.moe_a2a_overlap and schedule in V_SCHEDULES  # pairs drawn as they run, the rest exposed
    ep_share = cost.ep_comm_s / (k * m * slowest.ep_s) if slowest.ep_s > 0 and not pairs else 1.0
    split = schedule in SPLIT_BACKWARD
    pieces = [stage_pieces(s, ep_exposed_share=ep_share, split=split) for s in stages]
    send_s = cost.pp_comm_s / (k * (v * m + p - 1)) / 2 if p > 1 else 0.0
    pace = pieces[stages.index(slowest)]
    slots = {kind: _slot(pace, kind, v=v, send_s=send_s)[0] * v for kind in LETTER}
    units, reruns_s = stage_rerun_units(step, slowest)
    mean_rerun_s = reruns_s / m / v  # the re-runs a uniform backward slot of one chunk holds
    timeline = simulate(
        schedule=schedule,
        pp=p,
        m=m,
        v=v,
        forward_s=[slots["forward"]] * p,
        backward_s=[slots["weight"] + max(0.0, slots["backward"] - reruns_s / m)] * p,
        weight_s=[slots["weight"]] * p if split else None,
        pair_saved_s=[pair_saved_s(a2a_pair_phases(slowest.blocks), v=v)] * p if pairs else None,
        rerun_s=units,
    )

    def drawn(segments) -> list[Span]:
        spans: list[Span] = []
        trios: list[list] = [[] for _ in range(p)]
        for seg in segments:
            if seg.kind in LETTER and seg.paired:
                trios[seg.stage].append(seg)
                if seg.kind == "weight":  # a pair's last segment (timeline.py)
                    phases = a2a_pair_phases(stages[seg.stage].blocks)
                    spans += pair_spans(trios[seg.stage], pieces[seg.stage], phases, plan=plan, send_s=send_s)
                    trios[seg.stage] = []
            elif seg.kind in LETTER:
                spans += _chunk_spans(seg, pieces[seg.stage], plan=plan, send_s=send_s, mean_rerun_s=mean_rerun_s)
        return spans

    spans, syncs = drawn(timeline.segments), split_syncs(cost, step_cost, k)
    length_s = max(pipeline_end_s(cost, plan, slowest) / k, max((s.end_s for s in spans), default=0.0))
    end = length_s
    if k > 1:  # k schedule steps end to end, each followed by its own syncs (module docstring)
        period_s = length_s + syncs.per_step[1] + syncs.per_step[2]
        steps = drawn(consecutive_steps(timeline.segments, steps=k, m=m, period_s=period_s))
        spans, end = steps + _step_syncs(spans, syncs, steps=k, length_s=length_s, pp=p), k * period_s
    by_stage: list[list[Span]] = [[] for _ in range(p)]
    for span in spans:
        by_stage[span.stage].append(span)
    for rank, mine in enumerate(by_stage):
        spans += _bubbles(mine, rank, end) + _tail(mine, rank, end, cost, plan, slowest, syncs)
    _share_bytes(spans, step_bytes)
    return spans


def _chunk_spans(seg, pieces: StagePieces, *, plan: Plan, send_s: float, mean_rerun_s: float = 0.0) -> list[Span]:
    """A chunk's own pieces from its slot's start, its send, and the hidden all-to-all under its compute; a V
    schedule's backward halves draw their own re-runs (``seg.rerun_s``) in place of the mean ``mean_rerun_s`` a
    uniform backward slot holds (report/timeline.py ``v_stage_passes``)."""
    v, p = plan.virtual_stages, plan.pp
    shape = v_shaped(plan.schedule)
    chunk = chunk_index(stage=seg.stage, local=seg.chunk, pp=p, v_shape=shape)
    name = chunk_name(seg.kind, seg.microbatch, chunk)
    _, drawn = _slot(pieces, seg.kind, v=v, send_s=send_s)
    if seg.rerun_s or (mean_rerun_s and seg.kind == "backward"):
        held = mean_rerun_s if seg.kind == "backward" else 0.0
        drawn = [("compute", max(0.0, drawn[0][1] + seg.rerun_s - held)), *drawn[1:]]
    spans, cursor = [], seg.start_s
    for thread, seconds in drawn:
        dur = max(0.0, min(seconds, seg.end_s - cursor))  # a stage heavier here than the pace is cut to its slot
        if thread == "compute":
            spans.append(Span(seg.stage, "compute", name, cursor, dur, seg.kind))
            hidden = pieces.hidden_ep_s * (pieces.fwd_share if seg.kind == "forward" else 1 - pieces.fwd_share) / v
            if hidden > 0 and seg.kind != "weight":
                spans.append(Span(seg.stage, "ep", f"ep all-to-all {name}", cursor, min(hidden, dur), "hidden"))
        else:
            spans.append(Span(seg.stage, thread, f"{thread} {name}", cursor, dur, "exposed"))
        cursor += dur
    last = p * v - 1
    sends = (seg.kind == "forward" and chunk < last and sent_from_prior(chunk + 1, pp=p, v_shape=shape)) or (
        seg.kind == "backward" and chunk > 0 and sent_from_prior(chunk, pp=p, v_shape=shape)
    )
    if sends and send_s > 0:
        what = "activation" if seg.kind == "forward" else "gradient"
        spans.append(Span(seg.stage, "pp", f"send {what} {name}", cursor, min(send_s, seg.end_s - cursor), "exposed"))
    return spans


def _bubbles(spans: list[Span], stage: int, end_s: float) -> list[Span]:
    """The gaps of ``stage``'s pipeline (its ``spans``) until ``end_s``: the bubble, on its compute thread."""
    busy = sorted((s.start_s, s.end_s) for s in spans if s.category != "hidden")
    gaps, cursor = [], 0.0
    for start, stop in busy + [(end_s, end_s)]:
        if start > cursor * (1 + 1e-12) + 1e-15:
            gaps.append(Span(stage, "compute", "bubble", cursor, start - cursor, "bubble"))
        cursor = max(cursor, stop)
    return gaps


def _step_syncs(one_step: list[Span], syncs: Syncs, *, steps: int, length_s: float, pp: int) -> list[Span]:
    """Each schedule step's own syncs (report/step_syncs.py) on every stage: the exposed ones after the step's
    pipeline (``length_s`` of its ``one_step`` spans), the hidden part ending with the stage's last backward."""
    _, exposed_s, zero_s = syncs.per_step
    hidden_s, period_s = syncs.per_step_hidden_s, length_s + exposed_s + zero_s
    out = []
    for stage in range(pp):
        last = max((s.end_s for s in one_step if s.stage == stage and s.category in ("backward", "weight")), default=0)
        for j in range(steps):
            offset, cursor = j * period_s, j * period_s + length_s
            if hidden_s > 0:
                start, dur = offset + max(0.0, last - hidden_s), min(hidden_s, last)
                out.append(Span(stage, "dp", f"dp gradient sync, schedule step {j}", start, dur, "hidden"))
            for name, seconds in (("dp gradient sync", exposed_s), ("ZeRO-3 gathers and reduce-scatters", zero_s)):
                if seconds > 0:
                    out.append(Span(stage, "dp", f"{name}, schedule step {j}", cursor, seconds, "exposed"))
                    cursor += seconds
    return out


def _tail(spans: list[Span], stage: int, start_s: float, cost: Cost, plan: Plan, slowest, syncs: Syncs) -> list[Span]:
    """The step's terms after ``stage``'s pipeline (its ``spans``; module docstring), once an optimizer step
    (``syncs.once``), and the dp sync's hidden part before it."""
    out = []
    dp_s, dp_exposed_s, zero_s = syncs.once
    hidden = dp_s - dp_exposed_s
    if hidden > 0:  # before the last schedule step's own hidden sync, if any
        last = max((s.end_s for s in spans if s.category in ("backward", "weight")), default=0)
        last -= syncs.per_step_hidden_s
        out.append(Span(stage, "dp", "dp gradient sync", max(0.0, last - hidden), min(hidden, last), "hidden"))
    sp_sync_s = cost.tp_comm_s - plan.num_microbatches * slowest.tp_s
    terms = (
        ("dp", "dp gradient sync", dp_exposed_s, "exposed"),
        ("tp", "tp sequence-parallel gradient all-reduce", sp_sync_s, "exposed"),
        ("dp", "ZeRO-3 gathers and reduce-scatters", zero_s, "exposed"),
        ("compute", "gradient accumulation", cost.grad_accum_s, "tail"),
        ("compute", "gradient compression", cost.compression_s, "tail"),
        ("compute", "optimizer step", cost.optimizer_s, "tail"),
    )
    cursor = start_s
    for thread, name, seconds, category in terms:
        if seconds > 0:
            out.append(Span(stage, thread, name, cursor, seconds, category))
            cursor += seconds
    return out


def _share_bytes(spans: list[Span], step_bytes: list[dict[str, float]]) -> None:
    """Each communication span's bytes: its stage's step bytes on its thread's dimension, shared by seconds."""
    totals: dict[tuple[int, str], float] = {}
    for s in spans:
        if s.thread != "compute":
            totals[(s.stage, s.thread)] = totals.get((s.stage, s.thread), 0.0) + s.dur_s
    for s in spans:
        if s.thread == "compute":
            continue
        total = totals[(s.stage, s.thread)]
        share = s.dur_s / total if total > 0 else 0.0
        exposed = s.dur_s if s.category == "exposed" else 0.0
        s.args = {
            "bytes": step_bytes[s.stage].get(s.thread, 0.0) * share,
            "exposed_s": exposed,
            "hidden_s": s.dur_s - exposed,
        }
