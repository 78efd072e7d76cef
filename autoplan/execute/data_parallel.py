"""Data parallelism realising the plan's ZeRO stage.

| zero | no pipeline, tp=1 | otherwise (pipeline stage or tp>1) |
|------|-------------------|------------------------------------|
| 0    | DDP               | explicit gradient all-reduce (DDP cannot wrap a pipeline stage, nor DTensor params) |
| 1    | explicit all-reduce + :class:`~autoplan.execute.zero.ShardedOptimizer` (states on one dp rank per parameter) | same |
| 2    | FSDP2 ``fully_shard(reshard_after_forward=False)``: grads and states sharded, params kept gathered between forward and backward | same |
| 3    | FSDP2 ``fully_shard(reshard_after_forward=True)``: params resharded after forward | same |

FSDP2 wraps each block, then the root (or the stage module), so each block's all-gather
overlaps the previous block's compute (as torchtitan's ``apply_fsdp``). With dp=1 nothing is
wrapped: there is no one to share with.

Explicit all-reduce: after backward, gradients (the local shards of DTensor gradients) are
flattened per dtype into one buffer, all-reduced with AVG over the dp group, and copied back.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel

from autoplan.types.plan import Plan


def dp_mode(*, plan: Plan) -> str:
    """'none', 'ddp', 'allreduce' or 'fsdp' for this plan."""
    if plan.dp == 1:
        return "none"
    if plan.zero_stage >= 2:
        return "fsdp"
    if plan.zero_stage == 0 and plan.pp == 1 and plan.tp == 1:
        return "ddp"
    return "allreduce"


def apply_fsdp(*, module: nn.Module, blocks: list[str], plan: Plan, dp_mesh: DeviceMesh,
               mp_policy: MixedPrecisionPolicy | None) -> nn.Module:
    """fully_shard each block present in ``module``, then ``module`` itself."""
    kwargs = {"mesh": dp_mesh, "reshard_after_forward": plan.zero_stage == 3}
    if mp_policy is not None:
        kwargs["mp_policy"] = mp_policy
    present = dict(module.named_modules())
    for fqn in sorted(blocks, key=lambda b: -b.count(".")):  # inner before outer, as fully_shard needs
        if fqn in present:
            fully_shard(present[fqn], **kwargs)
    fully_shard(module, **kwargs)
    return module


def apply_ddp(*, module: nn.Module, dp_mesh: DeviceMesh, device: torch.device) -> nn.Module:
    """Wrap ``module`` in DDP over the dp group."""
    device_ids = [device.index] if device.type == "cuda" else None
    return DistributedDataParallel(module, process_group=dp_mesh.get_group(), device_ids=device_ids)


def local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def allreduce_grads(*, params: list[nn.Parameter], dp_mesh: DeviceMesh) -> None:
    """Average every gradient over the dp group, one flat buffer per dtype."""
    group = dp_mesh.get_group()
    by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
    for param in params:
        if param.grad is not None:
            grad = local(param.grad)
            by_dtype.setdefault(grad.dtype, []).append(grad)
    op = dist.ReduceOp.AVG if dist.get_backend(group) == "nccl" else dist.ReduceOp.SUM
    size = dist.get_world_size(group)
    for grads in by_dtype.values():
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat, op=op, group=group)
        if op == dist.ReduceOp.SUM:
            flat /= size
        offset = 0
        for g in grads:
            g.copy_(flat[offset:offset + g.numel()].view_as(g))
            offset += g.numel()
