"""Why a plan syncs its replicas only every H steps (local SGD, DiLoCo), in one sentence (docs/cost-model.md,
"Local SGD and DiLoCo").

The plan is priced again with everything the same but ``sync_every = 1`` and plain averaging (the synchronous
plan: the next option, every gradient all-reduced each step). The sentence sets their data-parallel and ZeRO
sync (``Cost.dp_comm_exposed_s + Cost.zero_comm_s``, the outer all-reduce amortised over H), the outer sync's
stall once every H steps, their step times and their peaks side by side, and says that H is a convergence
trade the cost model cannot see.
"""

from __future__ import annotations

from dataclasses import replace

from autoplan.cost import CostModel, plan_mesh_groups
from autoplan.display import duration_text, number_text
from autoplan.report.hsdp import exposed_sync_s, links_text
from autoplan.types.cost import Cost
from autoplan.types.local_sgd import is_local_sgd, outer_degree, synchronous_fields
from autoplan.types.plan import Plan

GIB = 2**30


def local_sgd_why(model: CostModel, plan: Plan, cost: Cost) -> str:
    """The sentence (module docstring); '' for a synchronous plan."""
    if not is_local_sgd(plan):
        return ""
    synced = replace(plan, predicted=None, **synchronous_fields())
    synced_cost = model.estimate(synced)
    groups = plan_mesh_groups(model.profile, plan)
    outer = groups["dp_replicate"] if plan.dp_replicate > 1 else groups["dp"]
    saves = exposed_sync_s(synced_cost) - exposed_sync_s(cost)
    return (
        f"{_what(plan)} averages the {outer_degree(plan)} replicas' parameters once every {plan.sync_every} steps "
        f"({links_text(outer)}) instead of syncing their gradients every step: one "
        f"{cost.extra.get('outer_sync_bytes', 0) / 2**20:.1f} MiB fp32 all-reduce per rank that stalls the step it "
        f"ends for {duration_text(cost.extra.get('outer_sync_s', 0.0))}, so the data-parallel sync takes "
        f"{duration_text(exposed_sync_s(cost))} per step against {duration_text(exposed_sync_s(synced_cost))} "
        "synchronous "
        f"({duration_text(abs(saves))} {'less' if saves >= 0 else 'more'}; step {duration_text(cost.step_time_s)} "
        f"against {duration_text(synced_cost.step_time_s)}), for {number_text(cost.peak_memory_bytes / GIB)} GiB "
        f"per device against {number_text(synced_cost.peak_memory_bytes / GIB)} GiB. H = {plan.sync_every} is a "
        "convergence trade the cost model cannot see: the replicas train apart between syncs, so the run may need "
        "more steps to reach the same loss (benchmarks/convergence.py measures it on a small model)."
    )


def _what(plan: Plan) -> str:
    if plan.outer_optimizer == "average":
        return f"sync_every={plan.sync_every} (local SGD)"
    return (
        f"sync_every={plan.sync_every} with DiLoCo's outer Nesterov step (lr {plan.outer_lr:g}, momentum "
        f"{plan.outer_momentum:g})"
    )
