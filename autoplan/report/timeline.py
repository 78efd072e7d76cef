"""The pipeline timeline of one training step, simulated from the plan's schedule (docs/report.md,
"Figures", timeline.png). Each stage runs its own ordered list of operations; an operation starts
when the stage is free and its input has arrived:

- GPipe (Huang et al. 2019): every forward, then every backward.
- 1F1B (Narayanan et al. SC'21 section 2.2.1): stage k runs min(p - k - 1, m) warm-up forwards,
  then alternates one forward and one backward, then drains the backwards.
- Interleaved 1F1B (section 2.2.2, Megatron-LM's order): v chunks per stage (global chunk
  c = local * p + k), min(2 (p - k - 1) + (v - 1) p, m v) warm-up chunk-forwards.
- Zero-bubble (torch's ScheduleInterleavedZeroBubble order, :func:`zero_bubble_order`): each backward
  drawn as input gradients, then later weight gradients ("weight"), half the backward each
  (:data:`WEIGHT_SHARE`: stages.csv does not split it).
- V schedules (zbv, dualpipev: torch's order, cost/pp/v_orders.py via ``autoplan.cost.v_order``): two chunks
  per stage in the V placement (types/layout.py), the turn's hand-over unsent; a whole backward is drawn as its
  input half then its weight half, and DualPipeV's F&B pair as its forward then the other backward, as torch
  runs them; with the all-to-all overlapped (``pair_saved_s``) a pair takes its priced time, the seconds its
  overlap hides taken off its backward half, and its halves are marked ``paired`` (report/pair_layout.py
  draws them side by side).

The forward of (i, c) needs the forward of (i, c - 1) and the activation send; the backward of (i, c) the
backward of (i, c + 1) and the gradient send (the last chunk: its own forward). A send occupies the sender for
``send_s``. ``schedule_steps`` k runs k schedule steps of m / k end to end (:func:`consecutive_steps`). A final
segment shows the exposed dp sync and the optimizer step; gaps are the bubble. Stage times come from
stages.csv (backward = 2 x forward without ``forward_s``, Narayanan et al. section 5.1).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field, replace

from autoplan.cost import v_order
from autoplan.errors import AutoplanError
from autoplan.types.layout import chunk_index, sent_from_prior
from autoplan.types.schedules import SPLIT_BACKWARD, V_SCHEDULES, v_shaped

#: the weight gradients' share of a split backward: a matmul's dL/dW is one GEMM of its dL/dX's size
WEIGHT_SHARE = 0.5


@dataclass(frozen=True)
class Segment:
    stage: int
    kind: str  # forward | backward | send | sync | idle
    microbatch: int  # -1 for sync and idle
    chunk: int
    start_s: float
    end_s: float
    paired: bool = False  # a half of an overlapped F&B pair (module docstring)
    rerun_s: float = 0.0  # of its seconds, its recomputed blocks' re-runs placed per pass (``simulate``'s rerun_s)


@dataclass
class Timeline:
    pp: int
    schedule: str
    segments: list[Segment] = field(default_factory=list)
    note: str = ""

    @property
    def makespan_s(self) -> float:
        return max((s.end_s for s in self.segments), default=0.0)

    def busy_s(self, stage: int, kind: str) -> float:
        return sum(s.end_s - s.start_s for s in self.segments if s.stage == stage and s.kind == kind)


def stage_order(schedule: str, *, pp: int, stage: int, m: int, v: int = 1) -> list[tuple[str, int, int]]:
    """The operations of ``stage`` in the order it runs them: (kind, micro-batch, local chunk)."""
    if schedule == "gpipe":
        return [("forward", i, 0) for i in range(m)] + [("backward", i, 0) for i in range(m)]
    if schedule == "1f1b":
        forwards = [("forward", i, 0) for i in range(m)]
        backwards = [("backward", i, 0) for i in range(m)]
        return _one_f_one_b(forwards, backwards, warmup=min(pp - stage - 1, m))
    if schedule == "interleaved_1f1b":

        def unit(i: int, backward: bool) -> tuple[int, int]:
            group = (i // pp) % v
            return (i // (pp * v)) * pp + i % pp, (v - 1 - group) if backward else group

        total = m * v
        forwards = [("forward", *unit(i, False)) for i in range(total)]
        backwards = [("backward", *unit(i, True)) for i in range(total)]
        return _one_f_one_b(forwards, backwards, warmup=min(2 * (pp - stage - 1) + (v - 1) * pp, total))
    if schedule == "interleaved_zb":
        return zero_bubble_order(pp=pp, stage=stage, m=m, v=v)
    if schedule in V_SCHEDULES:
        return v_stage_order(schedule, pp=pp, stage=stage, m=m)
    raise AutoplanError(
        f"schedule '{schedule}' has no timeline; expected gpipe, 1f1b, interleaved_1f1b, interleaved_zb, zbv or "
        "dualpipev."
    )


def v_stage_order(schedule: str, *, pp: int, stage: int, m: int) -> list[tuple[str, int, int]]:
    """torch's order of a V ``schedule`` on ``stage`` (module docstring) as (kind, micro-batch, local chunk)."""
    return [op for op, _ in v_stage_ops(schedule, pp=pp, stage=stage, m=m)]


def v_stage_ops(schedule: str, *, pp: int, stage: int, m: int) -> list[tuple[tuple[str, int, int], bool]]:
    """:func:`v_stage_order`'s operations, each with whether it is a half of an F&B pair."""
    local = {stage: 0, 2 * pp - 1 - stage: 1}
    drawn = {"F": ("forward",), "B": ("backward",), "W": ("weight",), "BW": ("backward", "weight")}
    ops = []
    for action in v_order(schedule, pp=pp, m=m)[stage]:
        parts = [("F", *action[1:3]), ("BW", *action[3:5])] if action[0] == "FB" else [action]
        ops += [((kind, mb, local[chunk]), action[0] == "FB") for name, chunk, mb in parts for kind in drawn[name]]
    return ops


def v_stage_passes(schedule: str, *, pp: int, stage: int, m: int) -> list[int]:
    """Per operation of :func:`v_stage_ops`, the backward passes it runs, in each of which a recomputed block
    re-runs (cost/pp/reruns.py): a split B's input half and its W one each (chunk 0's B none: torch runs its W as
    the full backward), a whole backward (an F&B pair's too) one, drawn on its input half; a forward none."""
    passes = {"F": (0,), "B": (1,), "W": (1,), "BW": (1, 0)}
    out = []
    for action in v_order(schedule, pp=pp, m=m)[stage]:
        parts = [("F", *action[1:3]), ("BW", *action[3:5])] if action[0] == "FB" else [action]
        out += [0 if name == "B" and chunk == 0 else n for name, chunk, _ in parts for n in passes[name]]
    return out


def looped_stage_passes(order: list[tuple[str, int, int]], *, stage: int) -> list[int]:
    """Per operation of :func:`zero_bubble_order`'s ``order`` of ``stage``, the backward passes it runs, in each of
    which a recomputed block re-runs (cost/pp/reruns.py): an input backward and a weight backward one each, chunk
    0's input backward none (torch runs its W as the full backward), a forward none."""
    return [int(kind == "weight" or (kind == "backward" and (local, stage) != (0, 0))) for kind, _, local in order]


def zero_bubble_order(*, pp: int, stage: int, m: int, v: int) -> list[tuple[str, int, int]]:
    """torch's ScheduleInterleavedZeroBubble (ZB1P) order of ``stage``: (v - 1) r + p - 1 - stage warm-up
    forwards (r micro-batches per round), then one forward and one input backward per step, each step
    from the ``stage``-th on also running the weight backward ("weight") of the oldest input backward, then
    the remaining input and weight backwards."""
    per_round = m // max(1, m // pp)
    total, warmup = m * v, min((v - 1) * per_round + pp - 1 - stage, m * v)
    fwd_mb, bwd_mb = [0] * v, [0] * v
    order, backwards = [], []
    for step in range(total + warmup):
        if step < total:
            local = (step // per_round) % v
            order.append(("forward", fwd_mb[local], local))
            fwd_mb[local] += 1
        if step >= warmup:
            local = v - 1 - ((step - warmup) // per_round) % v
            order.append(("backward", bwd_mb[local], local))
            backwards.append((bwd_mb[local], local))
            bwd_mb[local] += 1
            if len(backwards) > stage:
                order.append(("weight", *backwards[len(backwards) - stage - 1]))
    return order + [("weight", *b) for b in backwards[max(0, len(backwards) - stage) :]]


def _one_f_one_b(forwards: list, backwards: list, *, warmup: int) -> list:
    order = forwards[:warmup]
    for f, b in zip(forwards[warmup:], backwards):
        order += [f, b]
    return order + backwards[len(forwards) - warmup :]


def simulate(
    *,
    schedule: str,
    pp: int,
    m: int,
    v: int,
    forward_s: list[float],
    backward_s: list[float],
    send_s: float = 0.0,
    tail_s: float = 0.0,
    note: str = "",
    weight_s: list[float] | None = None,
    pair_saved_s: list[float] | None = None,
    rerun_s: tuple[float, ...] = (),
    schedule_steps: int = 1,
) -> Timeline:
    """Simulate one step (module docstring); ``forward_s[k]``/``backward_s[k]`` are stage k's whole
    micro-batch times (all its chunks); ``weight_s[k]``, of ``backward_s[k]``, the weight gradients a
    split-backward schedule runs apart (default: :data:`WEIGHT_SHARE` of it); ``pair_saved_s[k]``: what
    an overlapped F&B pair of stage k saves (V schedules); ``rerun_s[c]``: under a V schedule or interleaved_zb,
    the seconds chunk c's recomputed blocks re-run in each of its backward passes (:func:`v_stage_passes`,
    :func:`looped_stage_passes`; cost/pp/reruns.py v_rerun_units, looped_rerun_units), beyond ``backward_s``;
    ``schedule_steps`` k: the m micro-batches run as k schedule steps of m / k, end to end."""
    if len(forward_s) != pp or len(backward_s) != pp:
        raise AutoplanError(
            f"the timeline needs {pp} stage times, got {len(forward_s)}; "
            "the plan folder's stages.csv does not match plan.json."
        )
    m //= schedule_steps  # one schedule step's micro-batches, simulated once and repeated
    orders = [stage_order(schedule, pp=pp, stage=k, m=m, v=v) for k in range(pp)]
    paired = [[False] * len(order) for order in orders]
    if pair_saved_s is not None and schedule in V_SCHEDULES:
        paired = [[pair for _, pair in v_stage_ops(schedule, pp=pp, stage=k, m=m)] for k in range(pp)]
    passes = [[0] * len(order) for order in orders]
    if rerun_s and schedule in V_SCHEDULES:
        passes = [v_stage_passes(schedule, pp=pp, stage=k, m=m) for k in range(pp)]
    elif rerun_s and schedule == "interleaved_zb":
        passes = [looped_stage_passes(order, stage=k) for k, order in enumerate(orders)]
    done: dict[tuple[str, int, int], float] = {}  # (kind, micro-batch, global chunk) -> arrival at its consumer
    clock, position = [0.0] * pp, [0] * pp
    timeline = Timeline(pp=pp, schedule=schedule, note=note)
    last = pp * v - 1
    while any(position[k] < len(orders[k]) for k in range(pp)):
        progressed = False
        for k in range(pp):
            while position[k] < len(orders[k]):
                kind, mb, local = orders[k][position[k]]
                chunk = chunk_index(stage=k, local=local, pp=pp, v_shape=v_shaped(schedule))
                ready = _ready(done, kind, mb, chunk, last)
                if ready is None:
                    break
                start = max(clock[k], ready)
                weight = None if weight_s is None else weight_s[k]
                duration = _duration(kind, forward_s[k], backward_s[k], weight, split=schedule in SPLIT_BACKWARD) / v
                pair = paired[k][position[k]]
                if pair and kind == "backward":
                    duration = max(0.0, duration - pair_saved_s[k])
                rerun = passes[k][position[k]] * rerun_s[chunk] if passes[k][position[k]] else 0.0
                duration += rerun
                timeline.segments.append(Segment(k, kind, mb, local, start, start + duration, pair, rerun))
                end = start + duration
                crosses = functools.partial(sent_from_prior, pp=pp, v_shape=v_shaped(schedule))
                sends = (kind == "forward" and chunk < last and crosses(chunk + 1)) or (
                    kind == "backward" and crosses(chunk)
                )
                if sends and pp > 1 and send_s > 0:
                    timeline.segments.append(Segment(k, "send", mb, local, end, end + send_s))
                    end += send_s
                done[(kind, mb, chunk)] = end
                clock[k] = end
                position[k] += 1
                progressed = True
        if not progressed:
            raise AutoplanError(
                f"the {schedule} timeline deadlocked at pp={pp}, m={m}, v={v}; "
                "this schedule needs pp to divide the micro-batches."
            )
    if schedule_steps > 1:
        period_s = max(clock)
        timeline.segments = consecutive_steps(timeline.segments, steps=schedule_steps, m=m, period_s=period_s)
        clock = [c + (schedule_steps - 1) * period_s for c in clock]
    _finish(timeline, clock, tail_s)
    return timeline


def consecutive_steps(segments: list[Segment], *, steps: int, m: int, period_s: float) -> list[Segment]:
    """``segments`` of one schedule step of ``m`` micro-batches drawn ``steps`` times, step j from j x
    ``period_s``, its micro-batch i named j m + i (module docstring)."""
    return [
        replace(s, microbatch=j * m + s.microbatch, start_s=s.start_s + j * period_s, end_s=s.end_s + j * period_s)
        for j in range(steps)
        for s in segments
    ]


def _duration(kind: str, forward_s: float, backward_s: float, weight_s: float | None, *, split: bool) -> float:
    """A stage's whole-micro-batch seconds of ``kind``: a split backward's input and weight parts are
    ``backward_s - weight_s`` and ``weight_s`` (its :data:`WEIGHT_SHARE` when not given; module docstring)."""
    if kind == "forward":
        return forward_s
    if not split:
        return backward_s
    weight = backward_s * WEIGHT_SHARE if weight_s is None else weight_s
    return weight if kind == "weight" else backward_s - weight


def _ready(done: dict, kind: str, mb: int, chunk: int, last: int) -> float | None:
    if kind == "forward":
        return 0.0 if chunk == 0 else done.get(("forward", mb, chunk - 1))
    if kind == "weight":
        return done.get(("backward", mb, chunk))
    return done.get(("forward", mb, chunk)) if chunk == last else done.get(("backward", mb, chunk + 1))


def _finish(timeline: Timeline, clock: list[float], tail_s: float) -> None:
    """Add the sync/optimizer tail and the idle gaps of every stage."""
    end = max(clock) if clock else 0.0
    for k in range(timeline.pp):
        if tail_s > 0:
            timeline.segments.append(Segment(k, "sync", -1, 0, end, end + tail_s))
        busy = sorted((s.start_s, s.end_s) for s in timeline.segments if s.stage == k and s.kind != "idle")
        cursor = 0.0
        for start, stop in busy:
            if start > cursor + 1e-15:
                timeline.segments.append(Segment(k, "idle", -1, 0, cursor, start))
            cursor = max(cursor, stop)
        if cursor < end + tail_s - 1e-15:
            timeline.segments.append(Segment(k, "idle", -1, 0, cursor, end + tail_s))


def from_plan_folder(folder) -> Timeline:
    """The timeline of the folder's plan, from plan.json and stages.csv."""
    plan, stages = folder.plan, folder.stages
    if plan is None or stages is None:
        raise AutoplanError(
            f"plan folder '{folder.path}' has no plan.json or stages.csv, so there is no timeline to draw; "
            "re-run `autoplan plan`."
        )
    stages = stages.sort_values("stage")
    total = stages["micro_batch_time_s"].astype(float).tolist()
    note = ""
    if "forward_s" in stages:
        forward = stages["forward_s"].astype(float).tolist()
    else:
        forward, note = [t / 3.0 for t in total], "forward/backward split assumed 1:2 (stages.csv has no forward_s)"
    backward = [t - f for t, f in zip(total, forward)]
    neighbours = [(k > 0) + (k < plan.pp - 1) for k in range(plan.pp)]
    send_s = max((s / n for s, n in zip(stages["send_recv_s"].astype(float), neighbours) if n), default=0.0)
    breakdown = plan.predicted.breakdown if plan.predicted else {}
    tail_s = breakdown.get("dp_comm_exposed_s", 0.0) + breakdown.get("optimizer_s", 0.0)
    return simulate(
        schedule=plan.schedule,
        pp=plan.pp,
        m=plan.num_microbatches,
        v=plan.virtual_stages,
        forward_s=forward,
        backward_s=backward,
        send_s=send_s,
        tail_s=tail_s,
        note=note,
        schedule_steps=plan.schedule_steps,
    )
