"""Hybrid sharded data parallelism (HSDP): the dp axis split into replicate x shard (docs/cost-model.md, "HSDP").

``Plan.dp_replicate`` = R splits the ``dp`` data-parallel ranks into R groups of S = dp / R consecutive dp
ranks. ZeRO-1/2/3 shards the model states over the S ranks of a shard group (innermost, so within a node
when ``S * cp * tp`` fits one) and replicates them across the R groups: each rank reduce-scatters its
gradients over its shard group and all-reduces its 1/S shard across the R replicas (FSDP2's HSDP on a 2-D
``(dp_replicate, dp_shard)`` DeviceMesh; torchtitan's ``data_parallel_replicate_degree``; Megatron-Core's
``--num-distributed-optimizer-instances``). With R = 1 the shard group is every dp rank: today's ZeRO.
Beside context parallelism the shard group is the S x cp ranks of the flattened ``(dp_shard, cp)`` axes
(torchtitan's ``dp_shard_cp``), which hold the same weights; the replicas stay R.

Rank layout: the dp coordinate ``d = r * S + s`` (r the replica, s the shard rank), row-major as
torch's ``DeviceMesh._unflatten`` lays out ``("dp_replicate", "dp_shard")``.
"""

from __future__ import annotations

import copy
from typing import Any

from autoplan.errors import PlanError
from autoplan.types.layout import axis_groups

#: The dp axis of an HSDP plan, unflattened (shard innermost).
HSDP_AXES = ("dp_replicate", "dp_shard")


def dp_shard(plan: Any) -> int:
    """S = dp / dp_replicate: the ranks one ZeRO shard group spans (module docstring)."""
    return plan.dp // plan.dp_replicate


def state_shards(plan: Any) -> int:
    """S x cp: the ranks over which ZeRO shards one rank's model states (the flattened ``(dp_shard, cp)`` axes of
    the module docstring; dp x cp without HSDP), as the cost model's memory sees them (cost/cp/weights.py
    ``weight_sync_plan``, then :func:`shard_view`)."""
    return plan.dp * plan.cp // plan.dp_replicate


def check_dp_replicate(plan: Any) -> None:
    """The rules of ``Plan.dp_replicate``, one sentence each (module docstring)."""
    r = plan.dp_replicate
    if not (isinstance(r, int) and not isinstance(r, bool) and r >= 1):
        raise PlanError(f"plan dp_replicate={r!r}; expected an integer >= 1.")
    if r == 1:
        return
    if plan.dp % r:
        raise PlanError(f"plan dp_replicate={r} must divide dp={plan.dp}: dp splits into replicate x shard groups.")
    if plan.zero_stage < 1:
        raise PlanError(
            f"plan dp_replicate={r} with zero_stage 0: HSDP replicates ZeRO-sharded states; use zero_stage 1, 2 or 3."
        )
    if plan.dp // r * plan.cp < 2:
        raise PlanError(
            f"plan dp_replicate={r} leaves shard groups of one rank (dp={plan.dp}, cp={plan.cp}); use zero_stage 0 to "
            "replicate over every dp rank, or a dp_replicate that leaves 2 or more ranks per shard group."
        )
    if plan.ep > 1:
        raise PlanError(
            f"plan dp_replicate={r} with ep={plan.ep}: HSDP composes with tp, pp and cp only so far; "
            "use ep=1, or dp_replicate=1."
        )


def shard_view(plan: Any) -> Any:
    """``plan`` as its sharded states see it: dp = S ranks and no replicas (what each rank holds, the
    ZeRO messages of its shard group). The plan itself when dp_replicate is 1."""
    if plan.dp_replicate == 1:
        return plan
    view = copy.copy(plan)  # not replace(): a valid plan's view needs no re-check, and pricing asks often
    view.dp, view.dp_replicate = dp_shard(plan), 1
    return view


def hsdp_groups(*, pp: int, dp: int, tp: int, dp_replicate: int, cp: int = 1) -> dict[str, list[list[int]]]:
    """Every shard and replicate group of a ``(pp, dp_replicate, dp_shard, cp, tp)`` mesh, as global ranks:
    "dp_shard" is the S x cp ranks of the flattened (dp_shard, cp) axes (stride tp), "dp_replicate" the R
    ranks (stride S cp tp) holding the same shard."""
    degrees = [("pp", pp), (HSDP_AXES[0], dp_replicate), (HSDP_AXES[1], dp // dp_replicate * cp), ("tp", tp)]
    return {axis: axis_groups(degrees, axis) for axis in HSDP_AXES}
