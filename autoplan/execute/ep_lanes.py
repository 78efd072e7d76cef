"""Two lanes for the expert-parallel all-to-all, so that one micro-batch's forward and another's backward can run
at once on one rank, each exchanging tokens on its own process group (``Plan.moe_a2a_overlap`` under DualPipeV:
autoplan/execute/overlap_f_b.py; docs/executor.md, "EP all-to-all overlap").

Lane 0 is the ep group every step uses; lane 1 a second group over the same ranks, made at set-up by every rank in
the same order (:func:`second_groups`). A thread runs on lane 0 unless :meth:`Lanes.second` marks it (thread-local):
the overlapped pair's backward half. A collective's group is then read when it runs, not when its forward ran:
:class:`LaneAllToAll`'s backward sends on lane 1 while a pair's backward half runs, else on lane 0, whatever thread
autograd runs it on (the caller's on CPU, a device thread on CUDA, which has no lane of its own): no other backward
runs on the rank meanwhile, so a micro-batch whose forward ran on lane 0 sends its gradients on lane 1 when its
backward is the pair's other half. On each group, every rank of an ep
group issues the same collectives in the same order: the ranks of an ep group share a pipeline rank and so the
schedule's actions, and within an action each lane's collectives come from one thread, one after another.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Iterator

import torch
import torch.distributed as dist
from torch.distributed._functional_collectives import all_to_all_single, wait_tensor
from torch.distributed.device_mesh import DeviceMesh


class Lanes:
    """The ep group's two lanes (module docstring), and which one the calling thread is on."""

    def __init__(self, groups: tuple[dist.ProcessGroup, dist.ProcessGroup]):
        self.groups = groups
        self._local = threading.local()
        self._backward_lane = 0  # 1 while a pair's backward half runs, on any thread (module docstring)

    def group(self) -> dist.ProcessGroup:
        """The calling thread's lane's group."""
        return self.groups[getattr(self._local, "lane", 0)]

    def backward_group(self) -> dist.ProcessGroup:
        """The group of a backward's all-to-all: lane 1 while a pair's backward half runs (module docstring)."""
        return self.groups[self._backward_lane]

    @contextlib.contextmanager
    def second(self) -> Iterator[None]:
        """The calling thread, and the backward it runs, on lane 1 while inside."""
        self._local.lane = self._backward_lane = 1
        try:
            yield
        finally:
            self._local.lane = self._backward_lane = 0


def second_groups(expert_mesh: DeviceMesh) -> dist.ProcessGroup:
    """A second group over each ep group's ranks (every rank calls it, in the same order); this rank's."""
    names = expert_mesh.mesh_dim_names
    ranks = expert_mesh.mesh.movedim(names.index("ep"), -1).reshape(-1, expert_mesh["ep"].size()).tolist()
    mine, _ = dist.new_subgroups_by_enumeration(ranks)
    return mine


def exchange(counts: torch.Tensor, lanes: Lanes) -> torch.Tensor:
    """``counts`` split evenly over the lane's ranks, each part sent to its rank (the functional all-to-all, whose
    output selective recomputation keeps: module docstring)."""
    return _all_to_all(counts, None, None, lanes.group())


class LaneAllToAll(torch.autograd.Function):
    """``rows`` exchanged over the calling thread's lane (``recv_splits`` rows from each rank, ``send_splits`` to
    each); the gradient goes back on the lane of the backward running it (module docstring)."""

    @staticmethod
    def forward(ctx, rows: torch.Tensor, recv_splits: list[int], send_splits: list[int], lanes: Lanes):
        ctx.splits, ctx.lanes = (recv_splits, send_splits), lanes
        return _all_to_all(rows, recv_splits, send_splits, lanes.group())

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        recv_splits, send_splits = ctx.splits
        return _all_to_all(grad, send_splits, recv_splits, ctx.lanes.backward_group()), None, None, None


def _all_to_all(rows: torch.Tensor, recv_splits: list[int] | None, send_splits: list[int] | None, group):
    """The functional all-to-all and its wait (a wait is an op: autoplan/execute/overlap_f_b.py runs it outside the
    audit's lock, so that neither half waits on its lane holding it)."""
    return wait_tensor(all_to_all_single(rows.contiguous(), recv_splits, send_splits, group))
