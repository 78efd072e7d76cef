"""Measure collectives between N local processes (gloo on CPU, NCCL when GPUs are present).

Each of N spawned processes (autoplan/profile/measure/ranks.py) joins one
``torch.distributed`` group and times every collective at geometric message sizes (fewer
repeats at large sizes). A time is the
median over repeats on each rank, then the maximum over ranks (the slowest rank sets the
step). Sizes S are full message bytes in the nccl-tests convention: the all_reduce buffer,
the all_gather output, the reduce_scatter input, the all_to_all buffer, and the message of
a send/recv (timed as a ping-pong between rank pairs, halved).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from autoplan.errors import RunError
from autoplan.types.profile import COLLECTIVES

Points = dict[str, list[list[float]]]


@dataclass(frozen=True)
class CommSweep:
    min_bytes: int = 1024
    max_bytes: int = 256 * 2**20
    factor: int = 2
    collectives: tuple[str, ...] = COLLECTIVES
    overlap: bool = True  # also time a collective overlapped with compute (overlap.py)

    def sizes(self) -> list[int]:
        sizes, size = [], self.min_bytes
        while size <= self.max_bytes:
            sizes.append(size)
            size *= self.factor
        return sizes

    def repeats(self, nbytes: int) -> int:
        """Fewer repeats for large messages: they are slow and already steady."""
        return 20 if nbytes <= 64 * 2**10 else 10 if nbytes <= 4 * 2**20 else 5 if nbytes <= 32 * 2**20 else 3


def choose_backend(*, processes: int) -> str:
    """NCCL when each process can have its own GPU, gloo otherwise (CPU)."""
    if torch.cuda.is_available():
        if torch.cuda.device_count() < processes:
            raise RunError(
                f"--devices {processes} needs {processes} GPUs but {torch.cuda.device_count()} are visible; "
                f"use --devices <= {torch.cuda.device_count()}."
            )
        return "nccl"
    return "gloo"


def _buffers(kind: str, numel: int, world: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(input, output) for one call; numel is a multiple of world."""
    full = torch.ones(numel, device=device)
    shard = torch.ones(numel // world, device=device)
    if kind == "all_gather":
        return shard, full
    if kind == "reduce_scatter":
        return full, shard
    return full, torch.empty_like(full)


def _op(kind: str, src: torch.Tensor, dst: torch.Tensor, rank: int, world: int) -> Callable[[], Any]:
    if kind == "all_reduce":
        return lambda: dist.all_reduce(src)
    if kind == "all_gather":  # all_gather_single / reduce_scatter_single replace the *_tensor names in newer torch
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        return lambda: gather(dst, src)
    if kind == "reduce_scatter":
        scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
        return lambda: scatter(dst, src)
    if kind == "all_to_all":
        return lambda: dist.all_to_all_single(dst, src)
    peer = rank ^ 1
    if peer >= world:  # the odd rank out idles
        return lambda: None
    if rank % 2 == 0:
        return lambda: (dist.send(src, peer), dist.recv(dst, peer))
    return lambda: (dist.recv(dst, peer), dist.send(src, peer))


def _time_one(kind: str, nbytes: int, repeats: int, rank: int, world: int, device: torch.device) -> float:
    numel = max(world, (nbytes // 4) // world * world)
    src, dst = _buffers(kind, numel, world, device)
    call = _op(kind, src, dst, rank, world)
    call()
    times = []
    for _ in range(repeats):
        dist.barrier()
        t0 = time.perf_counter()
        call()
        if device.type != "cpu":
            torch.accelerator.synchronize(device)
        times.append(time.perf_counter() - t0)
    median = statistics.median(times)
    return median / 2 if kind == "send_recv" else median


def time_collectives(
    sweep: CommSweep, *, rank: int, world: int, device: torch.device, tick: Callable[[str], None]
) -> dict[str, list[float]]:
    """This rank's median time of every collective at every size (called inside the group)."""
    times: dict[str, list[float]] = {}
    for kind in sweep.collectives:
        times[kind] = []
        for nbytes in sweep.sizes():
            times[kind].append(_time_one(kind, nbytes, sweep.repeats(nbytes), rank, world, device))
            tick("collectives")
    return times


def measure_collectives(
    *,
    processes: int,
    threads: int,
    sweep: CommSweep,
    timeout_s: float = 300.0,
    on_tick: Callable[[str], None] | None = None,
) -> tuple[str, Points]:
    """Spawn ``processes`` ranks, time every collective, return (backend, points per collective)."""
    from autoplan.profile.measure.ranks import ComputeJob, run_ranks

    backend, per_rank = run_ranks(
        processes=processes, threads=threads, job=ComputeJob(), sweep=sweep, timeout_s=timeout_s, on_tick=on_tick
    )
    return backend, merge_collectives(
        {r: result.collectives for r, result in per_rank.items()}, processes=processes, sweep=sweep
    )


def merge_collectives(per_rank: dict[int, dict[str, list[float]]], *, processes: int, sweep: CommSweep) -> Points:
    """[group_size, bytes, time_s] rows: the slowest rank's median at each size."""
    points: Points = {}
    for kind in sweep.collectives:
        group = 2 if kind == "send_recv" else processes
        points[kind] = [
            [group, float(size), max(per_rank[r][kind][i] for r in per_rank)] for i, size in enumerate(sweep.sizes())
        ]
    return points
