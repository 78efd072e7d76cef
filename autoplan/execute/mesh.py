"""The device mesh a plan runs on.

Ranks form a ``(pp, dp, cp, tp)`` mesh, tp innermost, as autoplan/types/layout.py states it for the
executor and the cost model alike. Every axis exists even when its degree is 1,
so the rest of the executor can always ask for ``mesh["dp"]``, ``mesh["cp"]`` or ``mesh["tp"]``.
The ranks that hold the same weights and average their gradients are a dp x cp group: with cp > 1
the dp and cp axes flattened into one ("dp_cp", :func:`grad_mesh`), else the dp axis itself.

With expert parallelism (``plan.ep > 1``) the dp axis is also unflattened into ``(edp, ep)``, ep
innermost, on a second mesh (:func:`expert_mesh`): consecutive dp ranks form an ep group, and the
ranks holding the same experts an edp group (autoplan/execute/expert_parallel.py). The plan's
``(pp, dp, tp)`` mesh is left as it is, so ``mesh["dp"]`` keeps meaning every data-parallel rank.
Beside tp > 1 the experts' layout folds over each stage's ``dp * cp * tp`` ranks instead (MoE Parallel
Folding, autoplan/types/expert_layout.py): a second root mesh ``(pp, edp, ep, etp)``, etp innermost, over
the same ranks in the same order, so an ep group may span tp ranks.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from autoplan.errors import PlanError, RunError
from autoplan.types.expert_layout import expert_dp, experts_apart
from autoplan.types.hsdp import HSDP_AXES, dp_shard
from autoplan.types.layout import EXPERT_AXES, EXPERT_TP_AXIS, MESH_AXES, mesh_shape
from autoplan.types.plan import Plan


def device_type() -> str:
    """'cuda' when CUDA devices are present, else 'cpu'."""
    return "cuda" if torch.cuda.is_available() else "cpu"


def local_device() -> torch.device:
    """This process's device: its CUDA device by LOCAL_RANK, or the CPU."""
    if device_type() == "cuda":
        index = int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count()
        torch.cuda.set_device(index)
        return torch.device("cuda", index)
    return torch.device("cpu")


def build_mesh(*, plan: Plan) -> DeviceMesh:
    """A DeviceMesh named (pp, dp, cp, tp) over the initialised default process group."""
    if not dist.is_available() or not dist.is_initialized():
        raise RunError(
            "parallelize() needs an initialised process group; "
            "call torch.distributed.init_process_group() first (or use `autoplan run`)."
        )
    world_size = dist.get_world_size()
    if world_size != plan.devices:
        cp = f" x cp={plan.cp}" if plan.cp > 1 else ""
        raise PlanError(
            f"the plan needs {plan.devices} processes (dp={plan.dp}{cp} x tp={plan.tp} x pp={plan.pp}) "
            f"but the process group has {world_size}; launch {plan.devices} processes."
        )
    return init_device_mesh(
        device_type(), mesh_shape(pp=plan.pp, dp=plan.dp, cp=plan.cp, tp=plan.tp), mesh_dim_names=MESH_AXES
    )


def grad_mesh(*, mesh: DeviceMesh, plan: Plan) -> DeviceMesh:
    """The ranks that average gradients: the dp axis, or with cp > 1 the dp and cp axes flattened
    ("dp_cp", dp-major as types/layout.py ``plan_groups`` states it), or under HSDP the dp axis (dp x cp)
    unflattened into the 2-D ``(dp_replicate, dp_shard)`` mesh, shard innermost (types/hsdp.py), on which
    FSDP2's ``fully_shard`` runs HSDP. A collective at cp > 1 or under HSDP: every rank calls it once, in
    the same order."""
    if plan.dp_replicate > 1 and plan.cp == 1:
        return mesh._unflatten("dp", (plan.dp_replicate, dp_shard(plan)), HSDP_AXES)[HSDP_AXES]
    if plan.cp == 1:
        return mesh["dp"]
    flat = mesh["dp", "cp"]._flatten("dp_cp")
    if plan.dp_replicate > 1:  # the shard group is the flattened (dp_shard, cp): dp-major, so replica-major too
        return flat._unflatten("dp_cp", (plan.dp_replicate, dp_shard(plan) * plan.cp), HSDP_AXES)
    return flat


def grad_groups(grad: DeviceMesh | None) -> list[tuple[DeviceMesh, str]]:
    """The gradient-sync meshes of :func:`grad_mesh`'s and the dims the audit names them: the dp x cp ranks
    as "dp", or under HSDP the shard group as "dp" and the replicate group as "dp_replicate"."""
    if grad is None or grad.size() == 1:
        return []
    if grad.ndim == 2:
        return [(grad[HSDP_AXES[1]], "dp"), (grad[HSDP_AXES[0]], HSDP_AXES[0])]
    return [(grad, "dp")]


def coordinates(mesh: DeviceMesh) -> dict[str, int]:
    """This rank's position on each axis, e.g. {'pp': 1, 'dp': 0, 'cp': 0, 'tp': 1}."""
    return {axis: mesh.get_local_rank(axis) for axis in MESH_AXES}


def expert_mesh(*, mesh: DeviceMesh, plan: Plan) -> DeviceMesh | None:
    """The ``(pp, edp, ep, cp, tp)`` mesh of an expert-parallel plan at tp = 1, or the folded ``(pp, edp,
    ep, etp)`` one beside tp (module docstring); None when the experts have no layout of their own
    (ep = expert_tp = 1). A collective: every rank calls it, in the
    same order."""
    if not experts_apart(plan):
        return None
    if plan.tp == 1 and plan.expert_tp == 1:
        return mesh._unflatten("dp", (plan.dp // plan.ep, plan.ep), EXPERT_AXES)
    shape = (plan.pp, expert_dp(plan), plan.ep, plan.expert_tp)
    return init_device_mesh(device_type(), shape, mesh_dim_names=("pp", *EXPERT_AXES, EXPERT_TP_AXIS))
