"""ZeRO stage 1 as the cost model prices it: reduce-scatter, sharded step, all-gather.

The local parameters of a rank (their local tensors, so tensor-parallel shards work) are laid
end to end in one flat vector of N elements, padded to N' = dp * ceil(N / dp). dp rank r owns
the slice [r N'/dp, (r+1) N'/dp) (Megatron-LM's distributed optimizer, Rajbhandari et al.
SC'20 "P_os"). One step:

1. reduce-scatter the flat gradient, in ``plan.grad_reduce_dtype``, over the dp group: each
   rank receives the sum of its slice (divided by dp: the mean, as DDP computes);
2. the inner optimizer (AdamW) steps an fp32 master copy of the owned slice only, so a rank
   holds 1/dp of the master weights and moments (12 bytes per parameter / dp);
3. all-gather the updated slices into the flat parameter vector and copy it back.

Per step and rank that is one reduce-scatter of N' gradient elements and one all-gather of N'
parameter elements: the cost model's ZeRO-1 terms (autoplan/cost/model.py). Gradients stay
whole through the backward, in one flat fp32 buffer of N' elements for plain fp32 parameters
(execute/flat_grads.py: reduce-scattered in place, the all-gather's target), else copied into
one and freed. The reduced values exist only as each rank's slice, which
:meth:`ShardedOptimizer.reduced_gradients` gathers for --verify. Under HSDP (a 2-D ``(dp_replicate,
dp_shard)`` mesh, types/hsdp.py) the slices are over the shard group's S ranks and step 1 also all-reduces
each across the replicas (still the mean over all dp). Under expert parallelism the sliced expert
parameters get a second ``ShardedOptimizer`` over their edp group, dividing by dp instead of the group's
size (autoplan/execute/expert_parallel.py); :class:`ShardedOptimizers` steps both as one.
"""

from __future__ import annotations

import math
from typing import Callable

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import DeviceMesh

from autoplan.execute.data_parallel import local
from autoplan.execute.expert_parallel import ExpertParallel, split_params
from autoplan.execute.flat_grads import FlatGrads, holds_flat_grads
from autoplan.types.hsdp import HSDP_AXES


def padded_numel(numel: int, dp: int) -> int:
    """N' = dp * ceil(N / dp): the flat length every rank's slice divides evenly."""
    return dp * math.ceil(numel / dp)


class ShardedOptimizer:
    """An optimizer over this rank's 1/dp slice of the flat parameters (module docstring)."""

    def __init__(
        self,
        *,
        params: list[nn.Parameter],
        optimizer_fn: Callable,
        dp_mesh: DeviceMesh,
        reduce_dtype: torch.dtype = torch.float32,
        divide_by: int | None = None,
    ):
        self.params = params
        self.replicas = dp_mesh[HSDP_AXES[0]].get_group() if dp_mesh.ndim == 2 else None  # HSDP (docstring)
        shard_mesh = dp_mesh[HSDP_AXES[1]] if dp_mesh.ndim == 2 else dp_mesh
        self.group = shard_mesh.get_group()
        self.dp, self.rank = shard_mesh.size(), shard_mesh.get_local_rank()
        self.divide_by = divide_by or dp_mesh.size()  # the reduced gradient is the slices' sum over this
        self.reduce_dtype = reduce_dtype
        self.numel = sum(local(p).numel() for p in params)
        self.shard = padded_numel(self.numel, self.dp) // self.dp
        flat = self._flat([local(p.data) for p in params], torch.float32)
        self.master = nn.Parameter(flat[self.rank * self.shard : (self.rank + 1) * self.shard].clone())
        self.inner = optimizer_fn([self.master])
        self.param_groups = self.inner.param_groups
        self.grads = FlatGrads(params=params, numel=self.shard * self.dp) if holds_flat_grads(params) else None

    def _flat(self, tensors: list[torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
        flat = torch.zeros(
            self.shard * self.dp,
            dtype=dtype,
            device=tensors[0].device,  # the parameters' (an offloaded master lives on the host: offload.py)
        )
        offset = 0
        for t in tensors:
            flat[offset : offset + t.numel()].copy_(t.reshape(-1))
            offset += t.numel()
        return flat

    def held_tensors(self) -> list[torch.Tensor]:
        """Tensors this optimizer keeps besides its inner states: the fp32 master slice, and the flat
        gradient buffer where the gradients are its views."""
        return [self.master] + ([self.grads.buffer] if self.grads is not None else [])

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Unset every gradient: the next backward's first gradient is copied into the flat buffer."""
        for param in self.params:
            param.grad = None
        self.master.grad = None

    @torch.no_grad()
    def step(self, *, gather: bool = True) -> None:
        """Reduce-scatter, step the slice, and all-gather the parameters; ``gather=False`` leaves
        the all-gather to the caller (execute/param_gather.py: under the next forward)."""
        self._reduce_scatter_gradients()
        self.inner.step()
        if gather:
            self._all_gather_parameters()

    @torch.no_grad()
    def reduced_gradients(self) -> list[torch.Tensor]:
        """Each parameter's dp-mean gradient as a local tensor, from the slices the last step
        reduced (an all-gather; for --verify, outside the step)."""
        return self.per_parameter(self.gather(self.master.grad))

    def gather(self, mine: torch.Tensor) -> torch.Tensor:
        """The whole flat vector from every dp rank's slice ``mine`` (an all-gather)."""
        gathered = torch.empty(self.shard * self.dp, dtype=mine.dtype, device=mine.device)
        dist.all_gather_into_tensor(gathered, mine.detach().contiguous(), group=self.group)
        return gathered

    def per_parameter(self, flat: torch.Tensor) -> list[torch.Tensor]:
        """Views of a whole flat vector, one per parameter, shaped like its local tensor."""
        views, offset = [], 0
        for param in self.params:
            data = local(param.data)
            views.append(flat[offset : offset + data.numel()].view_as(data))
            offset += data.numel()
        return views

    def my_slice(self, flat: torch.Tensor) -> torch.Tensor:
        """This rank's slice of a whole flat vector."""
        return flat[self.rank * self.shard : (self.rank + 1) * self.shard]

    def _reduce_scatter_gradients(self) -> None:
        flat = self._flat_gradients()
        for param in self.params:  # the flat buffer carries them now: unset the per-parameter gradients
            param.grad = None
        mine = torch.empty(self.shard, dtype=self.reduce_dtype, device=flat.device)
        dist.reduce_scatter_tensor(mine, flat, op=dist.ReduceOp.SUM, group=self.group)
        del flat
        if self.replicas is not None:  # HSDP: the slice summed across the replicas too
            dist.all_reduce(mine, op=dist.ReduceOp.SUM, group=self.replicas)
        self.master.grad = self._master_gradient(mine)

    def _master_gradient(self, mine: torch.Tensor) -> torch.Tensor:
        """The master slice's gradient from the reduced slice ``mine``: the mean, in fp32."""
        return mine.to(torch.float32).div_(self.divide_by)

    def _flat_gradients(self) -> torch.Tensor:
        """The flat gradient in the reduce dtype: the gradient buffer itself when the gradients are its
        views and the reduction runs in fp32 (no copy), its cast otherwise; without one, a flat copy."""
        if self.grads is not None:
            return self.grads.collect().to(self.reduce_dtype)
        grads = [local(p.grad) if p.grad is not None else torch.zeros_like(local(p.data)) for p in self.params]
        return self._flat(grads, self.reduce_dtype)

    def _all_gather_parameters(self) -> None:
        """All-gather into the gradient buffer where there is one (its gradients were reduced and are
        unset until the next zero_grad), so the whole fp32 vector needs no second buffer."""
        into = self.grads.buffer if self.grads is not None else None
        self.finish_gather(*self.start_gather(async_op=False, into=into))

    def start_gather(self, *, async_op: bool = True, into: torch.Tensor | None = None) -> tuple[object, torch.Tensor]:
        """Start the all-gather of the updated slices into a flat buffer (``into``, or a new one): (its
        work handle or None, the buffer)."""
        first = local(self.params[0].data)
        gathered = into
        if gathered is None:
            gathered = torch.empty(self.shard * self.dp, dtype=first.dtype, device=first.device)
        mine = self._updated_slice(first)
        return dist.all_gather_into_tensor(gathered, mine, group=self.group, async_op=async_op), gathered

    def _updated_slice(self, like: torch.Tensor) -> torch.Tensor:
        """The updated master slice in ``like``'s dtype, on its device: what the all-gather sends."""
        return self.master.detach().to(like.dtype)

    @torch.no_grad()
    def finish_gather(self, work: object, gathered: torch.Tensor) -> None:
        """Wait for the all-gather ``work`` and copy the flat buffer into the parameters."""
        if work is not None:
            work.wait()
        offset = 0
        for param in self.params:
            data = local(param.data)
            data.copy_(gathered[offset : offset + data.numel()].view_as(data))
            offset += data.numel()

    def state_dict(self) -> dict:
        return self.inner.state_dict()


class ShardedOptimizers:
    """Several :class:`ShardedOptimizer` stepped as one (dense parameters over dp, experts over edp)."""

    def __init__(self, parts: list[ShardedOptimizer]):
        self.parts = parts
        self.params = [p for part in parts for p in part.params]
        self.param_groups = [g for part in parts for g in part.param_groups]

    @property
    def state(self) -> dict:
        return {k: v for part in self.parts for k, v in part.inner.state.items()}

    def held_tensors(self) -> list[torch.Tensor]:
        return [t for part in self.parts for t in part.held_tensors()]

    def zero_grad(self, set_to_none: bool = True) -> None:
        for part in self.parts:
            part.zero_grad(set_to_none)

    def step(self) -> None:
        for part in self.parts:
            part.step()

    def reduced_gradients(self) -> list[torch.Tensor]:
        return [g for part in self.parts for g in part.reduced_gradients()]

    def state_dict(self) -> dict:
        return {str(i): part.state_dict() for i, part in enumerate(self.parts)}


def sharded_optimizer(
    *,
    params: list[nn.Parameter],
    optimizer_fn: Callable,
    dp_mesh: DeviceMesh,
    reduce_dtype: torch.dtype,
    ep: ExpertParallel | None = None,
) -> ShardedOptimizer | ShardedOptimizers:
    """ZeRO-1's optimizer: one :class:`ShardedOptimizer` over dp, plus, with expert parallelism,
    one over edp for the expert parameters that divides by dp (module docstring)."""
    dense, experts = split_params(params, ep)
    main = ShardedOptimizer(params=dense, optimizer_fn=optimizer_fn, dp_mesh=dp_mesh, reduce_dtype=reduce_dtype)
    if not experts:
        return main
    return ShardedOptimizers(
        [
            main,
            ShardedOptimizer(
                params=experts,
                optimizer_fn=optimizer_fn,
                dp_mesh=ep.edp_mesh,
                reduce_dtype=reduce_dtype,
                divide_by=ep.dp,
            ),
        ]
    )
