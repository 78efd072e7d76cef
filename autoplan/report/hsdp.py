"""Why a plan replicates its ZeRO states across HSDP groups, in one sentence (docs/cost-model.md, "HSDP").

The plan is priced again with the same degrees, ZeRO stage and everything else but ``dp_replicate = 1``
(full sharding over every dp rank: the next option down in memory). The sentence sets the exposed ZeRO
and data-parallel sync of the two (``Cost.zero_comm_s + Cost.dp_comm_exposed_s``), their step times and
their peaks per device side by side, and says which links each plan's shard group spans
(cost/network/mesh.py).
"""

from __future__ import annotations

from dataclasses import replace

from autoplan.cost import CostModel, plan_mesh_groups
from autoplan.display import duration_text
from autoplan.types.cost import Cost
from autoplan.types.hsdp import dp_shard
from autoplan.types.local_sgd import is_local_sgd
from autoplan.types.plan import Plan

GIB = 2**30


def hsdp_why(model: CostModel, plan: Plan, cost: Cost) -> str:
    """The sentence (module docstring); '' for a plan without HSDP, or one whose replicas sync every H steps
    (report/local_sgd.py says why: full sharding leaves no replicas to average)."""
    if plan.dp_replicate == 1 or is_local_sgd(plan):
        return ""
    flat = replace(plan, dp_replicate=1, predicted=None)
    flat_cost = model.estimate(flat)
    shard, full = plan_mesh_groups(model.profile, plan)["dp_shard"], plan_mesh_groups(model.profile, flat)["dp_shard"]
    replicas = plan_mesh_groups(model.profile, plan)["dp_replicate"]
    s = dp_shard(plan)
    than = "less" if exposed_sync_s(cost) < exposed_sync_s(flat_cost) else "more"
    return (
        f"dp_replicate={plan.dp_replicate} replicates the ZeRO-{plan.zero_stage} states across "
        f"{plan.dp_replicate} groups of {s} ranks: each group's all-gathers and reduce-scatters run "
        f"{links_text(shard)} instead of {links_text(full)} for all {plan.dp} ranks, and only 1/{s} of the "
        f"gradients is all-reduced across the replicas ({links_text(replicas)}), so the exposed ZeRO and "
        f"gradient sync takes {duration_text(exposed_sync_s(cost))} per step, {than} than the "
        f"{duration_text(exposed_sync_s(flat_cost))} of full sharding (step {duration_text(cost.step_time_s)} against "
        f"{duration_text(flat_cost.step_time_s)}), for {cost.peak_memory_bytes / GIB:.1f} GiB per device against "
        f"{flat_cost.peak_memory_bytes / GIB:.1f} GiB."
    )


def exposed_sync_s(cost: Cost) -> float:
    return cost.zero_comm_s + cost.dp_comm_exposed_s


def links_text(group) -> str:
    """Where a group's collectives run: inside one node (its NVLink), or across how many nodes."""
    return f"across {group.nodes} nodes" if group.spans_nodes else "within one node"
