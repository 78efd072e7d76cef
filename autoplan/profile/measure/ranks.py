"""The N measuring processes: spawn them, let every rank run the same jobs, gather the results.

Each of N spawned processes (one GPU each under NCCL, else CPU ranks under gloo) sets the
profile's thread count, joins one ``torch.distributed`` group and runs, in order:

1. the compute job (``ComputeJob``): every (case, dtype) timed by all ranks at once
   (``timing.median_time_s(concurrent=True)``), then the memory-bandwidth kernels and the
   host dispatch overhead per op (overhead.py) the same way. The executor runs
   ``devices_per_node`` ranks computing at once, so this is the rate a rank achieves in a real
   run: on a CPU node the ranks share cores, caches and DRAM bandwidth; on a GPU node each has
   its own device but the host is shared.
2. the collective sweep (collectives.time_collectives);
3. unless ``sweep.overlap`` is off, the overlap test (overlap.time_overlap).

Every process and the group have timeouts, so a stuck rank ends the run with an error.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from autoplan.errors import RunError
from autoplan.jobs.spawn import spawn_ranks
from autoplan.profile.measure.collectives import CommSweep, choose_backend, time_collectives
from autoplan.profile.measure.compute import CaseSpec, make_case, memory_bandwidth, time_case
from autoplan.profile.measure.overhead import time_op_overhead
from autoplan.profile.measure.overlap import time_overlap

Tick = Callable[[str], None]


@dataclass(frozen=True)
class ComputeJob:
    """What every rank times: ``items`` are (case, dtype) pairs; ``memory_bytes`` 0 skips memory;
    ``overhead_budget_s`` 0 skips the op-overhead chains (else the budget of each chain timing)."""

    items: tuple[tuple[CaseSpec, str], ...] = ()
    budget_s: float = 0.25
    memory_bytes: int = 0
    overhead_budget_s: float = 0.0


@dataclass
class RankResult:
    """One rank's measurements: a time per job item, (copy bandwidth, memory efficiency), collectives."""

    compute_s: list[float]
    memory: tuple[float, float] | None
    collectives: dict[str, list[float]]
    overlap: tuple[float, float, float] | None = None  # (t_comp, t_comm, t_both), overlap.py
    op_overhead: tuple[float, float] | None = None  # (forward_s, backward_s) per op, overhead.py


def run_compute_job(
    job: ComputeJob, *, device: torch.device, tick: Tick
) -> tuple[list[float], tuple[float, float] | None]:
    """Time every item and the memory kernels together with the other ranks (the op overhead:
    ``run_overhead_job``)."""
    times = []
    for spec, dtype in job.items:
        times.append(
            time_case(make_case(spec), dtype_name=dtype, device=device, budget_s=job.budget_s, concurrent=True).time_s
        )
        tick("compute")
    memory = None
    if job.memory_bytes:
        memory = memory_bandwidth(device=device, nbytes=job.memory_bytes, budget_s=2 * job.budget_s, concurrent=True)
        tick("memory")
    return times, memory


def run_overhead_job(job: ComputeJob, *, device: torch.device, tick: Tick) -> tuple[float, float] | None:
    """(forward_s, backward_s) host overhead per op, timed together with the other ranks; None when skipped."""
    if not job.overhead_budget_s:
        return None
    overhead = time_op_overhead(device=device, budget_s=job.overhead_budget_s, concurrent=True)
    tick("overhead")
    return overhead


def _worker(
    rank: int,
    world: int,
    port: int,
    backend: str,
    threads: int,
    job: ComputeJob,
    sweep: CommSweep,
    timeout_s: float,
    results: Any,
) -> None:
    try:
        torch.set_num_threads(threads)
        device = torch.device("cuda", rank) if backend == "nccl" else torch.device("cpu")
        if backend == "nccl":
            torch.cuda.set_device(device)
        dist.init_process_group(
            backend,
            init_method=f"tcp://127.0.0.1:{port}",
            rank=rank,
            world_size=world,
            timeout=timedelta(seconds=timeout_s),
            device_id=device if backend == "nccl" else None,  # NCCL binds the rank's GPU; no guessing (and no warning)
        )
        tick = (lambda phase: results.put(("tick", phase))) if rank == 0 else (lambda phase: None)
        compute_s, memory = run_compute_job(job, device=device, tick=tick)
        op_overhead = run_overhead_job(job, device=device, tick=tick)
        collectives = time_collectives(sweep, rank=rank, world=world, device=device, tick=tick)
        overlap = time_overlap(device=device) if sweep.overlap else None
        if overlap is not None:
            tick("overlap")
        results.put(
            (
                "done",
                rank,
                RankResult(
                    compute_s=compute_s,
                    memory=memory,
                    collectives=collectives,
                    overlap=overlap,
                    op_overhead=op_overhead,
                ),
            )
        )
        dist.destroy_process_group()
    except Exception:  # reported to the parent, which raises one clear error
        results.put(("error", rank, traceback.format_exc(limit=3)))


def run_ranks(
    *,
    processes: int,
    threads: int,
    job: ComputeJob,
    sweep: CommSweep,
    timeout_s: float = 300.0,
    on_tick: Tick | None = None,
) -> tuple[str, dict[int, RankResult]]:
    """Spawn ``processes`` ranks (autoplan/jobs/spawn.py), run ``job`` and ``sweep`` in each;
    (backend, result per rank)."""
    if processes < 1:
        raise RunError(f"--devices {processes} cannot be measured; expected at least 1 process.")
    backend = choose_backend(processes=processes)
    per_rank = spawn_ranks(
        _worker,
        processes=processes,
        args=(backend, threads, job, sweep, timeout_s),
        timeout_s=timeout_s,
        on_tick=on_tick,
        what="measuring",
    )
    return backend, per_rank
