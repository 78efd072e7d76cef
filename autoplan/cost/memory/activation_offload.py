"""Activation offload (``Plan.offload_activations``): what a block sends to the host, what the device
keeps, and what the copies cost (docs/cost-model.md, "Activation offload"). Per micro-batch, for each
block b that does not recompute (autoplan/types/activation_offload.py), with S_b its saved activations
(the tracer's, each storage charged to the node that made it), O_b its output (what the next node reads)
and L the host link's bytes/s per direction (``Profile.host``):

    offloaded   H_b = S_b - O_b            all it saves but its output, which the next block saves as its
                                           input and the executor keeps on the device (module docstring there)
    kept        S_b' = O_b                 so the device holds the residual stream at each block boundary
    transient   T >= H_b                   the block's activations come back for its backward
    copies      2 H_b / L                  out in the forward, back in the backward: on the compute stream
    host        n H                        H = sum_b H_b, n the stage's micro-batches in flight

The copies are exposed: torch's ``save_on_cpu`` (torch 2.13) copies each saved tensor on the current
stream when autograd saves it and copies it back when the backward unpacks it, so the stream that
computes also copies, and the executor does the same (autoplan/execute/activation_offload.py). Nothing
overlaps them with the neighbouring block's compute; a runtime with a side stream (Megatron-LM's
``--cpu-offloading``) would hide part, which this price does not assume.
"""

from __future__ import annotations

from autoplan.cost.blocks import LayerSummary
from autoplan.cost.pp.schedule import in_flight_chunks
from autoplan.cost.stages import StageTotals
from autoplan.errors import PlanError
from autoplan.types.cost import Cost
from autoplan.types.plan import Plan
from autoplan.types.profile import Profile


def link_bytes_per_s(profile: Profile) -> float:
    """The host link a plan offloads activations over, or one sentence why it cannot."""
    if profile.host is None:
        raise PlanError(
            f"plan offload_activations=true but profile '{profile.name}' has no host section (host memory and link, "
            "docs/profile-format.md); add one, or run `autoplan profile` on the host, or use "
            "offload_activations=false."
        )
    return profile.host.link_bytes_per_s


def offloaded_bytes(block: LayerSummary) -> float:
    """H_b = S_b - O_b (module docstring), never below zero."""
    return max(0.0, block.saved_bytes - block.output_bytes)


def offload_block(stage: StageTotals, block: LayerSummary, *, link_bytes_per_s: float) -> None:
    """Move ``block``'s offloaded bytes from the stage's saved activations to the host, add its copies to
    the stage's micro-batch time and its returning activations to the backward's transient."""
    sent = offloaded_bytes(block)
    stage.saved_bytes -= sent
    chunk = max(stage.chunk_saved_bytes, default=0)  # the chunk ``block`` was just added to (cost/stages.py)
    stage.chunk_saved_bytes[chunk] = stage.chunk_saved_bytes.get(chunk, 0.0) - sent
    stage.offloaded_bytes += sent
    stage.offload_s += 2.0 * sent / link_bytes_per_s
    stage.peak_block_bytes = max(stage.peak_block_bytes, sent)


def host_activation_bytes(plan: Plan, stages: list[StageTotals], in_flight: list[float]) -> float:
    """n H on the stage that holds the most (module docstring); 0 without activation offload."""
    if not plan.offload_activations:
        return 0.0
    return max(n * stage.offloaded_bytes for n, stage in zip(in_flight, stages))


def activation_copy_s(plan: Plan, stages: list[StageTotals], *, schedule_steps: int = 1) -> float:
    """The optimizer step's copies on the slowest stage's stream: m micro-batches of 2 H / L, ``plan`` being one
    of ``schedule_steps`` k schedule steps of m / k (types/schedule_steps.py)."""
    slowest = max(stages, key=lambda s: s.micro_batch_s)
    return schedule_steps * plan.num_microbatches * slowest.offload_s


def record_activation_offload(
    cost: Cost, profile: Profile, plan: Plan, stages: list[StageTotals], *, schedule_steps: int = 1
) -> None:
    """``cost.extra["activation_offload"]``: the host bytes (n H, one schedule step's in flight: ``plan`` is one of
    ``schedule_steps`` k steps of m / k), the optimizer step's copy bytes each way over all m micro-batches and
    their seconds; infeasible when the host, beside any offloaded model states (``cost.extra["host_bytes"]``),
    cannot hold them. Nothing without activation offload."""
    if not plan.offload_activations:
        return
    in_flight = [in_flight_chunks(plan, index) for index in range(len(stages))]
    held = host_activation_bytes(plan, stages, in_flight)
    copied = schedule_steps * plan.num_microbatches * max(stage.offloaded_bytes for stage in stages)
    copy_s = activation_copy_s(plan, stages, schedule_steps=schedule_steps)
    cost.extra["activation_offload"] = {"host_bytes": held, "copy_bytes": copied, "copy_s": copy_s}
    limit = profile.host.host_memory_bytes_per_device
    total = held + cost.extra.get("host_bytes", 0.0)
    if total > limit:
        cost.feasible = False
        what = (
            "offload_activations=true needs"
            if plan.offload == "none"
            else f"offload={plan.offload} plus offload_activations=true need"
        )
        cost.reason = (
            f"{what} {total / 2**30:.1f} GiB of host memory per device ({held / 2**30:.1f} GiB of activations) but "
            f"the host has {limit / 2**30:.1f} GiB per device"
        )
