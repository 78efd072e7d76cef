"""Offload (``Plan.offload``): what one device's host holds, what crosses its host<->device link per step,
and the step's price (docs/cost-model.md, "Offload"). With P the stage's parameters on one device (tp and
pp shards), N the dp x cp ranks that share them, P' = ceil(P / N) a rank's ZeRO slice, m the micro-batches,
r the reduce dtype's bytes, L the link's bytes/s per direction and A the host's Adam parameters/s:

    host      = 16 P'                 fp32 master (or weights) 4 + fp32 gradients 4 + Adam moments 8
    optimizer: down = r P', up = 4 P'  the reduced slice copied down, the updated fp32 slice copied up
    full:      up   = 4 m (2 P_blocks + P_root) / N   each block's shard gathered in its forward and again in
                                                      its backward (ZeRO-3), the root's once (FSDP2)
               down = 4 m P / N        each micro-batch's fp32 gradient shard (FSDP2 reduce-scatters each one)
    step      = exposed(down / L) + P' / A + exposed(up / L)

ZeRO-Offload (Ren et al., USENIX ATC'21, section 4.1, Fig. 5) copies each gradient bucket down during the
backward, and the CPU step runs after it: under a runtime that overlaps (DeepSpeed), the down copy hides
under the backward as a collective does (``CommOverlap.hidden_s``); autoplan's executor copies after the
reduce-scatter, in series. FSDP2 copies each shard on its all-gather and reduce-scatter streams, ahead of
and behind compute: both directions hide under the step's compute. The CPU step never hides (no delayed
update: it would change the numerics). A profile without ``host`` cannot offload.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from autoplan.cost.compute.roofline import PRECISION_BYTES
from autoplan.cost.stages import StageTotals
from autoplan.errors import PlanError
from autoplan.types.cost import Cost
from autoplan.types.plan import Plan
from autoplan.types.profile import Profile

#: host bytes per offloaded parameter: fp32 master (or weights) + fp32 gradient + two fp32 Adam moments
HOST_BYTES_PER_PARAM = 16
#: runtimes that copy ZeRO-Offload's gradients down under the backward (module docstring)
OVERLAPPING_RUNTIMES = ("deepspeed",)


@dataclass(frozen=True)
class OffloadStep:
    """One step's offload on one device: host bytes held, link bytes each way, and the seconds they cost."""

    host_bytes: float
    down_bytes: float
    up_bytes: float
    copy_s: float  # exposed link time, both directions
    adam_s: float  # the CPU Adam step

    @property
    def step_s(self) -> float:
        return self.copy_s + self.adam_s


def slice_params(plan: Plan, params: float) -> int:
    """P' = ceil(P / N): a rank's slice of the stage's parameters (execute/zero.py's padded shard)."""
    return math.ceil(round(params) / (plan.dp * plan.cp))


def offload_bytes(plan: Plan, *, params: float, block_params: float, reduce_bytes: int) -> tuple[float, float]:
    """(down, up) link bytes of one step (module docstring); block_params: the stage's parameters in blocks."""
    if plan.offload == "optimizer":
        mine = slice_params(plan, params)
        return reduce_bytes * mine, 4.0 * mine
    ranks, m = plan.dp * plan.cp, plan.num_microbatches
    return 4.0 * m * params / ranks, 4.0 * m * (2 * block_params + (params - block_params)) / ranks


def host(profile: Profile, plan: Plan):
    """The profile's host section, or one sentence why a plan that offloads cannot be priced."""
    if profile.host is None:
        raise PlanError(
            f"plan offload='{plan.offload}' but profile '{profile.name}' has no host section (host memory, link "
            "and CPU Adam rate); add one (docs/profile-format.md) or use offload='none'."
        )
    return profile.host


def offload_step(
    profile: Profile,
    plan: Plan,
    *,
    params: float,
    block_params: float,
    reduce_bytes: int,
    backward_s: float,
    compute_s: float,
) -> OffloadStep:
    """The step's offload on the fullest stage (module docstring): ``backward_s`` and ``compute_s`` are the
    step's backward and compute seconds the copies may hide under."""
    spec = host(profile, plan)
    down, up = offload_bytes(plan, params=params, block_params=block_params, reduce_bytes=reduce_bytes)
    down_s, up_s = down / spec.link_bytes_per_s, up / spec.link_bytes_per_s
    overlap = profile.comm_overlap
    if plan.offload == "full":
        copy_s = down_s + up_s - overlap.hidden_s(compute_s=compute_s, comm_s=down_s + up_s)
    elif plan.runtime in OVERLAPPING_RUNTIMES:
        copy_s = down_s - overlap.hidden_s(compute_s=backward_s, comm_s=down_s) + up_s
    else:
        copy_s = down_s + up_s
    mine = slice_params(plan, params)
    return OffloadStep(
        host_bytes=HOST_BYTES_PER_PARAM * mine,
        down_bytes=down,
        up_bytes=up,
        copy_s=copy_s,
        adam_s=mine / spec.adam_params_per_s,
    )


def host_shortfall(profile: Profile, plan: Plan, host_bytes: float) -> str:
    """'' when ``host_bytes`` fit the device's share of host memory, else why not (one clause)."""
    limit = host(profile, plan).host_memory_bytes_per_device
    if host_bytes <= limit:
        return ""
    return (
        f"offload='{plan.offload}' needs {host_bytes / 2**30:.1f} GiB of host memory per device but the host has "
        f"{limit / 2**30:.1f} GiB per device"
    )


def price_offload(cost: Cost, profile: Profile, plan: Plan, stages: list[StageTotals], *, backward_s: float) -> None:
    """The optimizer term of ``cost`` as the host runs it: :func:`offload_step` of the stage with the most
    parameters (under FSDP2, pp = 1, the nodes outside the blocks, first and last on the stage, are the root
    unit), its bytes in ``cost.extra["offload"]``; ``cost.compute_s`` must be priced. Nothing without offload."""
    if plan.offload == "none":
        return
    stage = max(stages, key=lambda s: s.params)
    blocks = stage.blocks[1:-1] if plan.pp == 1 else stage.blocks
    step = offload_step(
        profile,
        plan,
        params=stage.params,
        block_params=sum(b.param_count for b in blocks),
        reduce_bytes=PRECISION_BYTES[plan.grad_reduce_dtype],
        backward_s=backward_s,
        compute_s=cost.compute_s,
    )
    cost.optimizer_s = step.step_s
    cost.extra["offload"] = asdict(step)
