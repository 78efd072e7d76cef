"""Mixture-of-Experts blocks under sequence parallelism: each tp rank routes and runs its own tokens
(docs/executor.md, "Expert parallelism", under tensor parallelism; docs/cost-model.md, "MoE under
tensor parallelism").

A dropless MoE block is token-wise, so under SP it runs whole, with its replicated weights, on the
rank's ``1 / tp`` of the tokens:

1. the ``Shard(1)`` input becomes its local shard;
2. every parameter (``Replicate``) becomes its local tensor, whose gradient is a ``Partial`` sum;
3. the block's own forward runs on them (``torch.func.functional_call``), the experts through
   their dispatch (autoplan/execute/expert_dispatch.py) as at ep = 1;
4. the output is the ``Shard(1)`` DTensor of the local result.

Nothing is communicated; ``finalize_tp_grads`` (autoplan/execute/tensor_parallel.py) all-reduces
the partial gradients once a step: what the cost model prices (autoplan/cost/tp/block.py
``token_wise_nodes``) and Megatron-Core runs at expert-tensor-parallel size 1. Without SP the block
runs whole on every rank under DTensor's rules (``ExpertsDispatch._replicated``). With ep > 1 beside tp
(MoE Parallel Folding, autoplan/execute/expert_parallel.py) the experts are ep DTensors instead: step 2
gives their local slices, whose gradients are this rank's own, and the dispatch exchanges the shard's
rows over ep by all-to-all.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard

from autoplan.errors import PlanError
from autoplan.types.graph import within
from autoplan.types.plan import Plan

SEQ_DIM = 1  # autoplan/execute/tensor_parallel.py: the sequence dim of [batch, seq, ...]


def moe_blocks(experts_fqns: list[str]) -> list[str]:
    """The MoE block of each experts module: its parent (autoplan/trace/moe.py ``experts_of``);
    none for experts at the model's root, whose parent is the whole model."""
    return sorted({parent for parent in (fqn.rpartition(".")[0] for fqn in experts_fqns) if parent})


def check_unsplit(*, plan: Plan, blocks: list[str]) -> None:
    """Raise PlanError, in one sentence, for a tp_plan that splits a module inside an MoE block, or
    for sequence parallelism with MoE blocks inside pipeline stages, whose exported graphs are
    shaped for the whole sequence (the planner does not offer it, autoplan/solve/space.py)."""
    if blocks and plan.tp > 1 and plan.sequence_parallel and plan.pp > 1:
        raise PlanError(
            f"plan pp={plan.pp} with tp={plan.tp} and sequence parallelism cannot run the MoE block "
            f"'{blocks[0]}' on a sequence shard inside a pipeline stage; plan sequence_parallel off or pp=1."
        )
    for fqn, split in plan.tp_plan.items():
        block = next((b for b in blocks if within(fqn, b)), None)
        if block is not None and split != "replicate" and plan.tp > 1:
            raise PlanError(
                f"plan tp_plan['{fqn}']='{split}' splits a module of the MoE block '{block}', which runs whole "
                "on each tensor-parallel rank's tokens (docs/moe.md); re-plan, or drop that entry."
            )


def apply_sequence_parallel_experts(*, modules: dict[int, nn.Module], blocks: list[str], tp_mesh: DeviceMesh) -> int:
    """Make each MoE block of ``blocks`` in the eager stage ``modules`` run on its sequence shard
    (module docstring); return how many. Call after tensor parallelism made the parameters DTensors."""
    count = 0
    for stage in modules.values():
        for fqn in blocks:
            try:
                block = stage.get_submodule(fqn)
            except AttributeError:  # another stage holds it
                continue
            block.forward = _on_sequence_shard(block, block.forward, tp_mesh)
            count += 1
    return count


def _on_sequence_shard(block: nn.Module, forward: Any, mesh: DeviceMesh) -> Any:
    def run(hidden: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        if not isinstance(hidden, DTensor):  # the local call below, or a caller outside the tp region
            return forward(hidden, *args, **kwargs)
        if hidden.dim() < 3 or hidden.shape[SEQ_DIM] % mesh.size():
            raise PlanError(
                f"MoE block input of shape {tuple(hidden.shape)} has no sequence dim that tp={mesh.size()} "
                "divides; plan sequence_parallel off for this model."
            )
        shard = hidden.redistribute(mesh, [Shard(SEQ_DIM)]).to_local(grad_placements=[Shard(SEQ_DIM)])
        params = {name: _partial_local(p, mesh) for name, p in block.named_parameters()}
        out = torch.func.functional_call(block, params, (shard, *args), kwargs)
        if not isinstance(out, torch.Tensor) or out.shape[:2] != shard.shape[:2]:
            raise PlanError(
                "an MoE block under sequence parallelism must return one tensor shaped like its input; "
                "plan sequence_parallel off for this model."
            )
        return DTensor.from_local(out, mesh, [Shard(SEQ_DIM)], run_check=False)

    return run


def _partial_local(param: torch.Tensor, mesh: DeviceMesh) -> torch.Tensor:
    """A replicated DTensor parameter as its local tensor, its gradient a partial sum over the tp group;
    an expert slice on the ep mesh of a folded layout (execute/expert_parallel.py) as its local slice, whose
    gradient is this rank's own."""
    if not isinstance(param, DTensor):
        return param
    if param.device_mesh.mesh_dim_names != mesh.mesh_dim_names:
        return param.to_local()
    if any(not isinstance(p, Replicate) for p in param.placements):
        raise PlanError(f"an MoE block parameter is split ({param.placements}); MoE blocks run unsplit, re-plan.")
    return param.to_local(grad_placements=[Partial()] * param.device_mesh.ndim)
