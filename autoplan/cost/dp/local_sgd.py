"""Local SGD and DiLoCo's outer sync, priced (types/local_sgd.py; docs/cost-model.md, "Local SGD and DiLoCo").

Per step the inner plan syncs within each replica only (cost/dp/messages.py drops the gradient traffic
across the outer group at H > 1). Every H = ``sync_every`` steps each rank all-reduces its P_l local
trainable parameters (its FSDP2 shard under HSDP, its tp/pp slice) in fp32 over the outer group of R
replicas, the executor's one flat all-reduce after the optimizer step, exposed (nothing overlaps it):

    t_sync = allreduce(4 P_l bytes, R ranks on the outer group's links)     (cost/network/comm.py)
    dp_comm_s += t_sync / H   (amortised per step; the stall itself is t_sync, recorded in cost.extra)

Memory: "nesterov" keeps an fp32 anchor and an fp32 momentum per local parameter, 8 P_l bytes (sharded as
the inner plan shards); the sync itself holds a flat fp32 copy of the local parameters, 4 P_l, after the
step (activations freed, gradients still held), priced as a buffer of the moment after the backward (M3 of
cost/memory/per_device.py), and the anchor and momentum as optimizer state in every moment.
DiLoCo's published setting for context, not fitted here: H = 500 with 8 replicas, 500x less communication
than synchronous data parallelism (Douillard et al. 2023, arXiv:2311.08105, section 3).
"""

from __future__ import annotations

from dataclasses import replace

from autoplan.cost.dp.messages import StepMessages
from autoplan.cost.memory.per_device import ModelStates
from autoplan.cost.moe.placement import optimizer_params
from autoplan.cost.network.comm import collective_time_s
from autoplan.cost.network.mesh import AxisGroup
from autoplan.cost.stages import StageTotals
from autoplan.types.cost import Cost
from autoplan.types.hsdp import shard_view
from autoplan.types.local_sgd import is_local_sgd, outer_state_bytes_per_param
from autoplan.types.plan import Plan
from autoplan.types.profile import Profile

#: the outer all-reduce moves fp32 parameters (execute/local_sgd.py)
OUTER_BYTES_PER_PARAM = 4


def outer_group(plan: Plan, groups: dict[str, AxisGroup]) -> AxisGroup:
    """The outer group's links: HSDP's replicate group, else the dp group (types/local_sgd.py)."""
    return groups["dp_replicate"] if plan.dp_replicate > 1 else groups["dp"]


def outer_sync_bytes(local_params: float) -> float:
    """Bytes of one rank's outer all-reduce message (module docstring)."""
    return OUTER_BYTES_PER_PARAM * local_params


def price_outer_sync(
    cost: Cost, profile: Profile, plan: Plan, stages: list[StageTotals], *, groups: dict[str, AxisGroup]
) -> None:
    """Add the outer sync's amortised time to a priced ``cost`` (module docstring), for the stage whose device
    holds the most trainable parameters; nothing for a synchronous plan."""
    if not is_local_sgd(plan):
        return
    message_bytes = outer_sync_bytes(max(optimizer_params(shard_view(plan), s) for s in stages))
    sync_s = collective_time_s(profile, "all_reduce", message_bytes, group=outer_group(plan, groups))
    per_step_s = sync_s / plan.sync_every
    cost.dp_comm_s += per_step_s
    cost.dp_comm_exposed_s += per_step_s
    cost.step_time_s += per_step_s
    cost.extra.update(outer_sync_s=sync_s, outer_sync_bytes=message_bytes, sync_every=plan.sync_every)


def outer_message(plan: Plan, stage: StageTotals) -> tuple[str, StepMessages] | None:
    """The outer all-reduce of one sync as the execution audit counts it (its audited step is a sync step,
    execute/job/runner.py): its dim, "dp_replicate" under HSDP else "dp", and one call of 4 P_l bytes;
    ``plan`` as its shard group sees it. None for a synchronous plan."""
    if not is_local_sgd(plan):
        return None
    dim = "dp_replicate" if plan.dp_replicate > 1 else "dp"
    return dim, StepMessages("all_reduce", 1, outer_sync_bytes(optimizer_params(shard_view(plan), stage)))


def with_outer_state(states: ModelStates, plan: Plan, stage: StageTotals) -> ModelStates:
    """``states`` with DiLoCo's anchor and momentum added to the optimizer's bytes (module docstring); ``plan``
    as its shard group sees it (types/hsdp.py shard_view), as cost/memory/plan.py prices it."""
    extra = outer_state_bytes_per_param(plan) * optimizer_params(plan, stage)
    return replace(states, optimizer_bytes=states.optimizer_bytes + extra) if extra else states


def outer_buffer_bytes(plan: Plan, stage: StageTotals) -> float:
    """The outer sync's flat fp32 copy of the local parameters, held after the step (module docstring)."""
    return outer_sync_bytes(optimizer_params(plan, stage)) if is_local_sgd(plan) else 0.0
