"""ZeRO stage 1: optimizer states sharded over the dp group, gradients all-reduced.

Each parameter is owned by one dp rank (greedy: next-largest parameter to the least-loaded
rank, as torch's ZeroRedundancyOptimizer partitions). A rank builds its optimizer over the
parameters it owns only, so it keeps ~1/dp of the states (Rajbhandari et al. 2020, ZeRO,
"P_os"). After its step, each owner broadcasts its updated parameters (their local tensors,
so tensor-parallel shards work) to the other dp ranks, coalesced per owner and dtype.

We do not use ZeroRedundancyOptimizer itself because it broadcasts whole tensors and cannot
handle DTensor (tensor-parallel) parameters.
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import DeviceMesh

from autoplan.execute.data_parallel import local


def partition(*, sizes: list[int], parts: int) -> list[int]:
    """Owner index of each item: largest first, each to the currently lightest part."""
    load = [0] * parts
    owner = [0] * len(sizes)
    for index in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        target = min(range(parts), key=lambda p: (load[p], p))
        owner[index] = target
        load[target] += sizes[index]
    return owner


class ShardedOptimizer:
    """An optimizer whose states live on one dp rank per parameter; same step() API."""

    def __init__(self, *, params: list[nn.Parameter], optimizer_fn: Callable, dp_mesh: DeviceMesh):
        self.params = params
        self.group = dp_mesh.get_group()
        self.dp_rank = dp_mesh.get_local_rank()
        self.owners = partition(sizes=[local(p).numel() for p in params], parts=dp_mesh.size())
        self.global_owner = [dist.get_global_rank(self.group, o) for o in range(dp_mesh.size())]
        owned = [p for p, o in zip(params, self.owners) if o == self.dp_rank]
        self.inner = optimizer_fn(owned) if owned else None
        self.param_groups = self.inner.param_groups if self.inner else []

    def zero_grad(self, set_to_none: bool = True) -> None:
        for param in self.params:
            param.grad = None

    @torch.no_grad()
    def step(self) -> None:
        if self.inner is not None:
            self.inner.step()
        for owner in range(len(self.global_owner)):
            self._broadcast_from(owner)

    def _broadcast_from(self, owner: int) -> None:
        by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
        for param, o in zip(self.params, self.owners):
            if o == owner:
                data = local(param.data)
                by_dtype.setdefault(data.dtype, []).append(data)
        for tensors in by_dtype.values():
            flat = torch.cat([t.reshape(-1) for t in tensors])
            dist.broadcast(flat, src=self.global_owner[owner], group=self.group)
            offset = 0
            for t in tensors:
                t.copy_(flat[offset:offset + t.numel()].view_as(t))
                offset += t.numel()

    def state_dict(self) -> dict:
        return self.inner.state_dict() if self.inner else {}
