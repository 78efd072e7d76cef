"""The EP all-to-all overlapped with the other micro-batch's compute (``Plan.moe_a2a_overlap``;
docs/cost-model.md, "EP all-to-all overlap").

A pair of micro-batches runs together, the forward of one beside the backward of another: DeepSeek-V3's
DualPipe F&B chunk (arXiv 2412.19437, section 3.2.1, Figure 4) and Megatron-Core's combined 1F1B under
``--overlap-moe-expert-parallel-comm`` (TransformerLayerSchedulePlan.run, core_v0.16.1). Per MoE layer of
the pair, each all-to-all runs on the communication stream beside one compute of the other micro-batch:

    combine  (bwd) | attention (fwd)        dispatch (fwd) | experts (bwd)
    dispatch (bwd) | experts   (fwd)        combine  (fwd) | attention (bwd)

``experts`` = the routed experts' grouped GEMMs (E_f, E_b), ``attention`` = the rest of the layer (F - E_f,
B - E_b); dispatch and combine carry one message each (cost/moe/experts.py), so each is half of its
direction's all-to-all seconds (A_f, A_b). While an all-to-all runs, the compute beside it has the SMs the
communication leaves: DeepSeek-V3 gives 20 of an H800's 132 SMs to it (section 3.2.2), ``r = 1 - 20/132``.
A phase of communication ``c`` beside compute ``k`` then takes ``max(c, k + (1 - r) c)``, and what it adds to
the compute is

    exposed(c, k) = max(c - k, (1 - r) c)
    pair_s        = F + B + sum over the four phases of exposed(c, k)

Micro-batches run alone (warm-up and cool-down: Megatron's combined 1F1B runs one extra forward after the first
stage's 2(p - 1) + (v - 1) p; a V schedule's pairs are its order's own, :func:`v_paired_share`) keep their
all-to-all exposed; the extra forward holds one more micro-batch (cost/pp/schedule.py in_flight_chunks).
"""

from __future__ import annotations

from dataclasses import dataclass

from autoplan.cost.pp.v_orders import v_order
from autoplan.types.schedules import V_SCHEDULES

#: DeepSeek-V3 section 3.2.2: "only 20 SMs are sufficient to fully utilize the bandwidths of IB and NVLink"
#: of the H800's 132; the compute beside an all-to-all runs on the rest
COMM_SMS, DEVICE_SMS = 20, 132
COMM_SM_SHARE = COMM_SMS / DEVICE_SMS


def exposed_phase_s(comm_s: float, compute_s: float, *, comm_sm_share: float = COMM_SM_SHARE) -> float:
    """What one all-to-all beside ``compute_s`` of the other micro-batch adds to the compute (module docstring)."""
    if comm_s <= 0.0:
        return 0.0
    return max(comm_s - compute_s, comm_sm_share * comm_s)


@dataclass(frozen=True)
class PairPhases:
    """The four (communication, compute) phases of one MoE layer's forward and backward run as a pair."""

    phases: tuple[tuple[float, float], ...]

    def exposed_s(self, *, comm_sm_share: float = COMM_SM_SHARE) -> float:
        return sum(exposed_phase_s(c, k, comm_sm_share=comm_sm_share) for c, k in self.phases)


def pair_phases(
    *, fwd_compute_s: float, fwd_a2a_s: float, bwd_compute_s: float, bwd_a2a_s: float, fwd_expert_s: float,
    bwd_expert_s: float,
) -> PairPhases:  # fmt: skip
    """The module docstring's four phases: each all-to-all (half a direction's seconds) beside its compute."""
    fwd_attention_s = max(0.0, fwd_compute_s - fwd_expert_s)
    bwd_attention_s = max(0.0, bwd_compute_s - bwd_expert_s)
    return PairPhases(
        phases=(
            (bwd_a2a_s / 2, fwd_attention_s),  # combine's gradient beside the forward's attention
            (fwd_a2a_s / 2, bwd_expert_s),  # dispatch beside the backward's experts
            (bwd_a2a_s / 2, fwd_expert_s),  # dispatch's gradient beside the forward's experts
            (fwd_a2a_s / 2, bwd_attention_s),  # combine beside the backward's attention
        )
    )


def overlapped_pair_s(
    fwd_compute_s: float, fwd_a2a_s: float, bwd_compute_s: float, bwd_a2a_s: float, *, fwd_expert_s: float,
    bwd_expert_s: float, comm_sm_share: float = COMM_SM_SHARE,
) -> float:  # fmt: skip
    """Seconds of one forward and one backward (of two micro-batches) run as a pair with their all-to-alls
    overlapped (module docstring): one MoE layer, or a chunk of identical ones (every argument summed)."""
    phases = pair_phases(
        fwd_compute_s=fwd_compute_s,
        fwd_a2a_s=fwd_a2a_s,
        bwd_compute_s=bwd_compute_s,
        bwd_a2a_s=bwd_a2a_s,
        fwd_expert_s=fwd_expert_s,
        bwd_expert_s=bwd_expert_s,
    )
    return fwd_compute_s + bwd_compute_s + phases.exposed_s(comm_sm_share=comm_sm_share)


def extra_forwards(plan) -> int:
    """Forwards a stage runs ahead of 1F1B's warm-up: Megatron's combined 1F1B schedules "one extra micro-batch
    forward step before the 1f1b stages" (schedules.get_pp_rank_microbatches), so one more micro-batch (chunk,
    interleaved) of activations is held; 0 without the overlap."""
    return 1 if plan.moe_a2a_overlap else 0


def alone_units(*, pp: int, virtual_stages: int) -> int:
    """Micro-batch chunks the first pipeline stage runs alone before its first pair: Megatron's warm-up
    (schedules.get_pp_rank_microbatches: 2 (p - 1) + (v - 1) p at v > 1, p - 1 under 1F1B) and the one
    extra forward its combined 1F1B schedules first; as many backwards run alone at the end."""
    warmup = 2 * (pp - 1) + (virtual_stages - 1) * pp if virtual_stages > 1 else pp - 1
    return warmup + 1


def paired_share(
    *, num_microbatches: int, pp: int, virtual_stages: int, schedule: str = "1f1b", rank: int = 0
) -> float:
    """The share of a stage's micro-batch chunks that run in pairs (module docstring): under a V schedule
    counted from stage ``rank``'s order, else Megatron's warm-up and cool-down."""
    if schedule in V_SCHEDULES:
        return v_paired_share(schedule, num_microbatches=num_microbatches, pp=pp, rank=rank)
    units = num_microbatches * virtual_stages
    return max(0, units - alone_units(pp=pp, virtual_stages=virtual_stages)) / units


def v_paired_share(schedule: str, *, num_microbatches: int, pp: int, rank: int) -> float:
    """Of ``rank``'s 2m chunk forwards (and as many backwards) under V ``schedule``, the share inside its order's
    F&B pairs (cost/pp/v_orders.py), each holding one forward and one backward: DualPipeV's rank r runs
    2m - 3p + r + 1 (one fewer on the last rank, which runs its first apart), ZBV none. A pair joins one chunk's
    forward with the rank's other chunk's backward, priced as a block's forward beside its own backward (the
    chunks' MoE layers alike). autoplan's executor runs them overlapped (autoplan/execute/overlap_f_b.py)."""
    actions = v_order(schedule, pp=pp, m=num_microbatches)[rank]
    return sum(action[0] == "FB" for action in actions) / (2 * num_microbatches)


def block_exposed_s(block) -> float:
    """One block's all-to-all left exposed when its forward and backward run in a pair (``block`` is a
    cost/blocks.py LayerSummary; 0 without experts)."""
    if block.ep_fwd_s + block.ep_bwd_s <= 0.0:
        return 0.0
    return pair_phases(
        fwd_compute_s=block.fwd_s,
        fwd_a2a_s=block.ep_fwd_s,
        bwd_compute_s=block.bwd_s,
        bwd_a2a_s=block.ep_bwd_s,
        fwd_expert_s=block.expert_fwd_s,
        bwd_expert_s=block.expert_bwd_s,
    ).exposed_s()


@dataclass(frozen=True)
class DrawnPhase:
    """One phase of a stage's pair as the predicted trace draws it (report/pair_layout.py): ``half`` computes
    ``compute_s`` ("forward" or "backward") while the other half's all-to-all sends ``comm_s``, of which
    ``exposed_s`` adds to the compute (module docstring)."""

    half: str
    compute_s: float
    comm_s: float
    exposed_s: float


#: which half computes in each of pair_phases' four phases
PHASE_HALVES = ("forward", "backward", "forward", "backward")


def stage_pair_phases(blocks) -> list[DrawnPhase]:
    """The four phases of a pair of ``blocks`` (cost/blocks.py LayerSummary, a stage's), each summed over the
    blocks as :func:`block_exposed_s` prices them one block at a time: their exposed seconds add to the pair's
    priced exposure."""
    sums = [[0.0, 0.0, 0.0] for _ in PHASE_HALVES]
    for block in blocks:
        phases = pair_phases(
            fwd_compute_s=block.fwd_s, fwd_a2a_s=block.ep_fwd_s, bwd_compute_s=block.bwd_s,
            bwd_a2a_s=block.ep_bwd_s, fwd_expert_s=block.expert_fwd_s, bwd_expert_s=block.expert_bwd_s,
        ).phases  # fmt: skip
        for total, (comm_s, compute_s) in zip(sums, phases):
            total[0] += compute_s
            total[1] += comm_s
            total[2] += exposed_phase_s(comm_s, compute_s)
    return [DrawnPhase(half, *total) for half, total in zip(PHASE_HALVES, sums)]


def step_ep_s(plan, stage, *, rank: int = 0) -> float:
    """The step's expert-parallel all-to-all seconds on ``stage`` (cost/stages.py StageTotals), pipeline stage
    ``rank``: all of it exposed, m x ep_s, unless the plan overlaps it; then the paired micro-batches expose only
    what their compute cannot cover (module docstring) and the rest (alone, or re-run by recompute) stays exposed."""
    m = plan.num_microbatches
    if not plan.moe_a2a_overlap:
        return m * stage.ep_s
    paired = paired_share(
        num_microbatches=m, pp=plan.pp, virtual_stages=plan.virtual_stages, schedule=plan.schedule, rank=rank
    )
    pair_a2a_s = sum(b.ep_fwd_s + b.ep_bwd_s for b in stage.blocks)
    pair_exposed_s = sum(block_exposed_s(b) for b in stage.blocks)
    return m * (stage.ep_s - paired * (pair_a2a_s - pair_exposed_s))
