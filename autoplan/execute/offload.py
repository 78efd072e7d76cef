"""ZeRO-Offload on ZeRO-1's sharded optimizer (``Plan.offload="optimizer"``; docs/cost-model.md, "Offload").

The sharded optimizer of autoplan/execute/zero.py keeps its fp32 master slice and its Adam state on the
host (pinned memory where CUDA exists) and steps there, as DeepSpeed's ZeRO-Offload does (Ren et al.,
USENIX ATC'21, section 4.1), also on one data-parallel rank (:class:`OneRank`: no collectives, the slice
is the whole vector). One step: reduce-scatter the gradients on the device (as ZeRO-1 does); copy this
rank's reduced slice down (r P' bytes, the reduce dtype); widen and average it on the host into the
master's gradient; step the master there; copy the updated slice up in the weights' dtype (4 P' for fp32
weights); all-gather it on the device. The copies are explicit ``copy_`` calls into tensors made on the
other side, so a CPU rank, whose host is its device, runs the same code path and counts the same bytes.

The host's work runs outside the dispatch modes that record the step (:func:`on_host`): the execution
audit (autoplan/execute/job/audit.py) measures the device's memory, collectives and FLOPs, and on a CPU
rank host and device share one memory. What crosses the link is counted by the optimizer itself
(:attr:`OffloadedOptimizer.copies`), which the audit reads as rows of dim "host" (kinds "d2h", "h2d")
against cost/memory/offload.py's bytes. Full offload ("full") is FSDP2's ``CPUOffloadPolicy``
(autoplan/execute/data_parallel.py ``apply_fsdp``).
"""

from __future__ import annotations

import contextlib
from collections import Counter
from typing import Any, Callable

import torch
import torch.nn as nn
from torch.utils._python_dispatch import _disable_current_modes

from autoplan.execute.zero import ShardedOptimizer

HOST = torch.device("cpu")


@contextlib.contextmanager
def on_host():
    """Run host work outside the step's dispatch recorders (module docstring)."""
    with _disable_current_modes():
        yield


def _pinned() -> bool:
    return torch.cuda.is_available()


class OneRank:
    """The data-parallel "mesh" of a plan without data parallelism (dp x cp = 1): one rank, no group, so
    ZeRO-Offload runs on one device as Ren et al. ran it (the whole master and Adam state on the host)."""

    ndim = 1

    def size(self) -> int:
        return 1

    def get_local_rank(self) -> int:
        return 0

    def get_group(self) -> None:
        return None


class OffloadedOptimizer(ShardedOptimizer):
    """ZeRO-1's sharded optimizer with its master slice, Adam state and step on the host (module docstring)."""

    on_host = True  # the audit counts none of its states as device memory

    def __init__(self, *, optimizer_fn: Callable, **zero: Any):
        super().__init__(optimizer_fn=optimizer_fn, **zero)
        with on_host():
            host = torch.empty(self.shard, dtype=torch.float32, device=HOST, pin_memory=_pinned())
            self.master = nn.Parameter(host.copy_(self.master.detach()))
            self.inner = optimizer_fn([self.master])
        self.param_groups = self.inner.param_groups
        self.copies: Counter = Counter()  # (kind, "count" | "bytes") -> total since built

    def held_tensors(self) -> list[torch.Tensor]:
        """The device's: the flat gradient buffer where there is one (the master lives on the host)."""
        return [self.grads.buffer] if self.grads is not None else []

    @torch.no_grad()
    def step(self, *, gather: bool = True) -> None:
        self._reduce_scatter_gradients()
        with on_host():
            self.inner.step()
        if gather:
            self._all_gather_parameters()

    @torch.no_grad()
    def reduced_gradients(self) -> list[torch.Tensor]:
        first = self.params[0].data
        return self.per_parameter(self.gather(self.master.grad.to(first.device)))

    def gather(self, mine: torch.Tensor) -> torch.Tensor:
        return mine if self.dp == 1 else super().gather(mine)  # one rank: its slice is the whole vector

    def _reduce_scatter_gradients(self) -> None:
        if self.dp > 1:
            super()._reduce_scatter_gradients()
            return
        flat = self._flat_gradients()  # one rank: nothing to reduce, the flat gradient goes down whole
        for param in self.params:
            param.grad = None
        self.master.grad = self._master_gradient(flat)

    def start_gather(self, *, async_op: bool = True, into: torch.Tensor | None = None) -> tuple[object, torch.Tensor]:
        if self.dp > 1:
            return super().start_gather(async_op=async_op, into=into)
        return None, self._updated_slice(self.params[0].data)  # one rank: the updated vector, copied up

    def _master_gradient(self, mine: torch.Tensor) -> torch.Tensor:
        """Copy the reduced slice down, then widen and average it on the host."""
        with on_host():
            down = torch.empty(mine.shape, dtype=mine.dtype, device=HOST, pin_memory=_pinned()).copy_(mine)
            self._count("d2h", down)
            return down.to(torch.float32).div_(self.divide_by)

    def _updated_slice(self, like: torch.Tensor) -> torch.Tensor:
        """Cast the updated master on the host, then copy it up into a device tensor the all-gather sends."""
        with on_host():
            cast = self.master.detach().to(like.dtype)
        up = torch.empty(self.shard, dtype=like.dtype, device=like.device).copy_(cast)
        self._count("h2d", up)
        return up

    def _count(self, kind: str, tensor: torch.Tensor) -> None:
        self.copies[(kind, "count")] += 1
        self.copies[(kind, "bytes")] += tensor.numel() * tensor.element_size()


def host_copies(optimizer: Any, since: Counter | None = None) -> Counter | list[tuple[str, str, int, int]]:
    """The optimizer's host copies so far (a Counter to pass back as ``since``), or, given ``since``, those
    made after it as the audit's comm rows (dim "host", kind, count, bytes); nothing for other optimizers."""
    copies = getattr(optimizer, "copies", Counter())
    if since is None:
        return Counter(copies)
    new = copies - since
    return [
        ("host", kind, new[(kind, "count")], new[(kind, "bytes")]) for kind in ("d2h", "h2d") if new[(kind, "count")]
    ]
