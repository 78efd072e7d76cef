"""Pipeline schedules: stage partition, bubble, micro-batches in flight, and gradient-sync overlap
(docs/cost-model.md, "Step time" and "Memory").

With p stages, m micro-batches and v model chunks per device:

    bubble = (p - 1) / v * T_max                          Narayanan et al. SC'21 section 2.2 (v = 1: GPipe, 1F1B)
    zero-bubble schedules (B and W apart): interleaved_zb's bubble the replay of torch's order
        (autoplan/cost/pp/looped_replay.py), in flight autoplan/cost/pp/zero_bubble.py; V schedules (zbv,
        dualpipev): the replay of their order (autoplan/cost/pp/replay.py), bubble and in flight
    in flight on stage i: GPipe m (Huang et al. 2019); 1F1B min(p - i, m) (Narayanan section 2.2.1);
        interleaved min(2 (p - i - 1) + (v - 1) p + 1, v m) chunks of 1/v of the stage
        (Megatron-LM's warm-up count; Korthikanti et al. 2022 section 4.2.3 for stage 0); one more under
        the EP all-to-all overlap's combined 1F1B (cost/moe/a2a_overlap.py)

After the stage's first backward the count drops by one unless the schedule refills it.
Gradient sync overlapped with the backward (PyTorch DDP's buckets, Li et al. VLDB 2020), in
reverse layer order on one stream:

    ready_l = sum of the backward times of the blocks after l (in backward order) up to l
    done_l  = max(done_{l-1}, ready_l) + t_sync(bytes_l)
    exposed = max(0, done_last - backward_end)
    exposed(eta) = exposed(1) + (1 - eta) * (total - exposed(1))     eta: profile comm_overlap.efficiency
"""

from __future__ import annotations

from autoplan.cost.moe.a2a_overlap import extra_forwards
from autoplan.cost.pp.looped_replay import looped_zb_bubble_s
from autoplan.cost.pp.replay import held_at_peak, replay_bubble_s
from autoplan.cost.pp.reruns import looped_rerun_units, v_rerun_units
from autoplan.cost.pp.zero_bubble import zero_bubble_in_flight
from autoplan.cost.stages import StageTotals
from autoplan.errors import PlanError
from autoplan.types.plan import Plan
from autoplan.types.schedules import V_SCHEDULES, ZERO_BUBBLE


def balanced_stages(layers: list[str], chunks: int) -> list[list[str]]:
    """Contiguous partition of ``layers`` into ``chunks`` parts whose sizes differ by at most one
    (the earlier chunks take the remainder)."""
    if chunks > max(1, len(layers)):  # one chunk holds the whole model, blocks or not
        raise PlanError(
            f"plan asks for {chunks} pipeline chunks but the model has {len(layers)} blocks; "
            "use fewer stages or virtual stages."
        )
    base, extra = divmod(len(layers), chunks)
    stages, start = [], 0
    for i in range(chunks):
        size = base + (1 if i < extra else 0)
        stages.append(layers[start : start + size])
        start += size
    return stages


def pipeline_bubble_s(
    plan: Plan, *, micro_batch_s: float, wgrad_s: float, forward_s: float = 0.0, rerun_s: dict[int, float] | None = None
) -> float:
    """The plan's pipeline bubble from its slowest stage's micro-batch seconds (module docstring), of
    which ``wgrad_s`` is weight gradients (what a zero-bubble schedule defers into the bubble) and
    ``forward_s`` the forward (the zero-bubble and V schedules' replays time F, B and W apart, and each backward's
    re-runs from ``rerun_s``, one re-run of each of the stage's recomputed chunks: StageTotals.chunk_rerun_s)."""
    p, v, m = plan.pp, plan.virtual_stages, plan.num_microbatches
    if plan.schedule in V_SCHEDULES:
        rank, legs = _v_legs(rerun_s or {}, pp=p)
        _, reruns_s = v_rerun_units(plan.schedule, pp=p, m=m, rank=rank, rerun_s=legs)
        backward_s = max(0.0, micro_batch_s - forward_s - wgrad_s - reruns_s / m)
        return replay_bubble_s(
            schedule=plan.schedule, pp=p, m=m, f=forward_s, b=backward_s, w=wgrad_s, rerun_s=legs, rank=rank
        )
    if plan.schedule in ZERO_BUBBLE:
        _, reruns_s = looped_rerun_units(pp=p, virtual_stages=v, m=m, rerun_s=rerun_s or {})
        backward_s = max(0.0, micro_batch_s - forward_s - wgrad_s - reruns_s / m)
        return looped_zb_bubble_s(pp=p, virtual_stages=v, m=m, f=forward_s, b=backward_s, w=wgrad_s, rerun_s=rerun_s)
    return (p - 1) / v * micro_batch_s


def _v_legs(rerun_s: dict[int, float], *, pp: int) -> tuple[int, tuple[float, float]]:
    """(the stage, one re-run of its chunks on the V's two legs: chunk ``stage`` and 2p - 1 - stage) of a stage's
    {chunk: one re-run's seconds}; (0, (0, 0)) for a stage without recomputation."""
    if not rerun_s:
        return 0, (0.0, 0.0)
    stage = min(c if c < pp else 2 * pp - 1 - c for c in rerun_s)
    return stage, (rerun_s.get(stage, 0.0), rerun_s.get(2 * pp - 1 - stage, 0.0))


def stage_rerun_units(plan: Plan, stage: StageTotals) -> tuple[tuple[float, ...], float]:
    """(per chunk, one re-run's seconds in each backward pass of the replay; the step's re-run seconds of a rank)
    of a replayed ``plan`` (a V schedule's or interleaved_zb's) whose ranks all run ``stage``'s work
    (cost/pp/reruns.py v_rerun_units, looped_rerun_units; empty and 0 without recomputation or replay): what
    report/step_layout.py draws."""
    p, m = plan.pp, plan.num_microbatches
    if plan.schedule in ZERO_BUBBLE:
        return looped_rerun_units(pp=p, virtual_stages=plan.virtual_stages, m=m, rerun_s=stage.chunk_rerun_s)
    if plan.schedule not in V_SCHEDULES:
        return (), 0.0
    rank, legs = _v_legs(stage.chunk_rerun_s, pp=p)
    return v_rerun_units(plan.schedule, pp=p, m=m, rank=rank, rerun_s=legs)


def stage_bubble_s(plan: Plan, slowest: StageTotals) -> float:
    """:func:`pipeline_bubble_s` of the plan's ``slowest`` stage."""
    return pipeline_bubble_s(
        plan,
        micro_batch_s=slowest.micro_batch_s,
        wgrad_s=slowest.wgrad_s,
        forward_s=slowest.forward_s,
        rerun_s=slowest.chunk_rerun_s,
    )


def bubble_floor(
    *, schedule: str, pp: int, virtual_stages: int, share: float = 0.0, forward_share: float = 0.0
) -> float:
    """Micro-batches of the slowest stage's time the bubble is at least (the search's bounds): (p - 1) / v;
    a zero-bubble schedule's (p - 1) / v times ``share``, a floor on (T - 2W - R) / T of every stage (R its re-runs)
    (:func:`autoplan.cost.pp.zero_bubble.bubble_share`; 0 when not known); a V schedule's (p - 1) / v times
    ``forward_share``, a floor on the slowest stage's f / T (:func:`autoplan.cost.pp.replay.v_forward_share`; 0
    when not known).

    The V floor: the replay (pipeline_bubble_s) gives every chunk f / 2, b / 2, w / 2 with f + b + w = T. Every
    action of rank p - 1 (chunks p - 1 and p) waits, through its inputs, for some micro-batch's forwards of chunks
    0..p - 2, p - 1 actions of f / 2 each run one after another, so none starts before (p - 1) f / 2; the rank then
    runs its own m (f + b + w) one action at a time (an F&B pair lasts F + BW: fb_pair_s), and the step ends no
    earlier: bubble = span - m T >= (p - 1) f / 2 = (p - 1) / v * (f / T) * T at v = 2."""
    if schedule in V_SCHEDULES:
        return (pp - 1) / virtual_stages * forward_share
    return (pp - 1) / virtual_stages * (share if schedule in ZERO_BUBBLE else 1.0)


def bubble_fraction(*, pp: int, num_microbatches: int, virtual_stages: int = 1) -> float:
    """(p - 1) / (v * m): the bubble as a fraction of the ideal (bubble-free) pipeline time."""
    return (pp - 1) / (virtual_stages * num_microbatches)


def in_flight_chunks(plan: Plan, stage: int) -> float:
    """Micro-batches of activations held on ``stage``, in units of the whole stage's layers."""
    p, m, v = plan.pp, plan.num_microbatches, plan.virtual_stages
    if plan.schedule == "gpipe":
        return float(m)
    if plan.schedule in V_SCHEDULES:  # chunks of half the stage, at the replay's peak
        return held_at_peak(schedule=plan.schedule, pp=p, m=m, rank=stage)[0] / v
    if plan.schedule in ZERO_BUBBLE:
        return zero_bubble_in_flight(pp=p, num_microbatches=m, virtual_stages=v)
    extra = extra_forwards(plan)  # the overlapped all-to-all's one more forward ahead (cost/moe/a2a_overlap.py)
    if plan.schedule == "1f1b":
        return float(min(p - stage + extra, m))
    chunks = min(2 * (p - stage - 1) + (v - 1) * p + 1 + extra, v * m)
    return chunks / v


def in_flight_after_first_backward(plan: Plan, stage: int) -> float:
    """Micro-batches of activations held on ``stage`` once its first backward is done (module
    docstring), in units of the whole stage's layers."""
    m, v = plan.num_microbatches, plan.virtual_stages
    held = in_flight_chunks(plan, stage) * v
    refilled = plan.schedule != "gpipe" and held < v * m
    return (held if refilled else held - 1) / v


def overlapped_sync_exposed_s(*, backward_s: list[float], sync_s: list[float]) -> float:
    """Exposed part of per-block gradient sync overlapped with the backward (module docstring).

    Both lists are in backward order (last block first); ``sync_s[i]`` is the time to reduce
    block i's gradients once its backward ends.
    """
    clock = done = 0.0
    for t_bwd, t_sync in zip(backward_s, sync_s):
        clock += t_bwd
        done = max(done, clock) + t_sync
    return max(0.0, done - clock)


def partially_hidden_s(*, exposed_s: float, total_s: float, efficiency: float) -> float:
    """Exposed time when only ``efficiency`` of the perfectly hidden ``total_s - exposed_s`` hides
    (module docstring)."""
    return exposed_s + (1.0 - efficiency) * max(0.0, total_s - exposed_s)


def prefetched_exposed_s(*, compute_s: list[float], comm_s: list[float], efficiency: float = 1.0) -> float:
    """Exposed time of per-block communication prefetched one block ahead (FSDP's forward and
    backward prefetch, Zhao et al. VLDB 2023): block i's comm runs under block i-1's compute,
    so the first block's comm is exposed and every later one hides ``efficiency`` of the part
    that fits under the compute before it."""
    if not comm_s:
        return 0.0
    exposed = comm_s[0]
    for t_prev, t_comm in zip(compute_s, comm_s[1:]):
        exposed += t_comm - efficiency * min(t_comm, t_prev)
    return exposed
