"""How much of a collective hides under concurrent compute on this device and backend.

Every rank of the measuring group times, at the same moment (a barrier before each repeat):

    t_comp  a compute kernel alone (square matmuls, repeated so that t_comp ~ t_comm);
    t_comm  an all_reduce of one DDP bucket (25 MB, what DDP overlaps with the backward) alone;
    t_both  the all_reduce issued asynchronously (``async_op=True``), the same compute, then ``wait()``.

With perfect overlap t_both = max(t_comp, t_comm); with none, t_comp + t_comm. So

    efficiency = (t_comp + t_comm - t_both) / min(t_comp, t_comm), clipped to [0, 1]

is the fraction of the shorter activity that hid under the longer (the cost model's
``CommOverlap.hidden_s``). Under NCCL the collective runs on its own CUDA stream (efficiency
~1, less SM contention); under gloo on a CPU it runs on gloo's threads, which share the cores
with the compute threads, so little hides. A time is each rank's median over repeats, then the
slowest rank's (the slowest rank sets the step), as for the collective sweep.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch
import torch.distributed as dist

#: Message of the overlap test: one DDP gradient bucket (torch DDP's default bucket_cap_mb = 25).
OVERLAP_BYTES = 25 * 2**20
REPEATS = 7


def overlap_efficiency(*, compute_s: float, comm_s: float, both_s: float) -> float:
    """(t_comp + t_comm - t_both) / min(t_comp, t_comm), clipped to [0, 1] (module docstring)."""
    shorter = min(compute_s, comm_s)
    if shorter <= 0:
        return 0.0
    return min(1.0, max(0.0, (compute_s + comm_s - both_s) / shorter))


def _sync(device: torch.device) -> None:
    if device.type != "cpu":
        torch.accelerator.synchronize(device)


def _median_s(call: Callable[[], None], *, device: torch.device, repeats: int) -> float:
    call()  # warm-up
    _sync(device)
    times = []
    for _ in range(repeats):
        dist.barrier()
        t0 = time.perf_counter()
        call()
        _sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _compute(device: torch.device) -> tuple[Callable[[int], None], float]:
    """A matmul loop ``run(k)`` and one matmul's time (agreed by all ranks: their max)."""
    n = 512 if device.type == "cpu" else 4096
    a, b = torch.randn(n, n, device=device), torch.randn(n, n, device=device)

    def run(k: int) -> None:
        for _ in range(k):
            torch.mm(a, b)

    one = torch.tensor([_median_s(lambda: run(1), device=device, repeats=REPEATS)], device=device)
    dist.all_reduce(one, op=dist.ReduceOp.MAX)
    return run, float(one.item())


def time_overlap(
    *, device: torch.device, nbytes: int = OVERLAP_BYTES, repeats: int = REPEATS
) -> tuple[float, float, float]:
    """This rank's (t_comp, t_comm, t_both) medians (called inside the group, on every rank)."""
    buf = torch.ones(max(1, nbytes // 4), device=device)
    comm_s = _median_s(lambda: dist.all_reduce(buf), device=device, repeats=repeats)
    agreed = torch.tensor([comm_s], device=device)
    dist.all_reduce(agreed, op=dist.ReduceOp.MAX)
    run, one_s = _compute(device)
    k = max(1, round(float(agreed.item()) / one_s))  # t_comp ~ t_comm: the test is most sensitive there
    compute_s = _median_s(lambda: run(k), device=device, repeats=repeats)

    def both() -> None:
        work = dist.all_reduce(buf, async_op=True)
        run(k)
        work.wait()

    both_s = _median_s(both, device=device, repeats=repeats)
    return compute_s, comm_s, both_s


def merge_overlap(per_rank: list[tuple[float, float, float]]) -> tuple[float, float, float]:
    """The slowest rank's time of each of the three."""
    return tuple(max(r[i] for r in per_rank) for i in range(3))  # type: ignore[return-value]
