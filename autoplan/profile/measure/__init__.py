"""measure_profile: measure the machine it runs on and return a Profile.

Order: (1) fix the thread count T per process so that N * T <= cores, (2) spawn N processes
(ranks.py) that each, at the same time, time the compute sweep, (with a model) its ops, the
memory kernels and the host dispatch overhead per op (overhead.py: ``device.op_overhead``),
then (3) time the collectives together and a collective overlapped with
compute (overlap.py: ``comm_overlap``), (4) time the host's copy and CPU Adam rates (host_offload.py:
``host``), and (5) fit and assemble.
A compute time (and each op-overhead number) is the median over ranks of each rank's median: the rate one rank achieves
while all N compute, which is how the executor runs ``devices_per_node`` ranks. The profile
records it (``device.source`` and ``description``). Only this package touches torch.distributed.
"""

from __future__ import annotations

import os
import platform
import statistics
from contextlib import nullcontext
from dataclasses import replace
from pathlib import Path

import torch
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from autoplan.jobs.threads import threads_per_process
from autoplan.profile.host import cpu_model
from autoplan.profile.measure.build import device_spec, link_spec, op_overhead
from autoplan.profile.measure.collectives import CommSweep, merge_collectives
from autoplan.profile.measure.compute import DEFAULT_SWEEP, ComputeSweep, default_sweep, dtype_specs, make_case
from autoplan.profile.measure.host_offload import measure_host
from autoplan.profile.measure.overlap import merge_overlap, overlap_efficiency
from autoplan.profile.measure.ranks import ComputeJob, RankResult, run_ranks
from autoplan.profile.measure.timing import default_device, supported_dtypes
from autoplan.types.profile import CommOverlap, DeviceSpec, LinkSpec, OpOverhead, OpTiming, Profile

__all__ = [
    "measure_profile",
    "measure_comm_overlap",
    "measure_op_overhead",
    "ComputeSweep",
    "CommSweep",
    "DEFAULT_SWEEP",
]


def measure_profile(
    *,
    devices: int = 2,
    name: str | None = None,
    threads: int | None = None,
    compute_sweep: ComputeSweep | None = None,
    comm_sweep: CommSweep = CommSweep(),
    model: str | os.PathLike | None = None,
    batch: int | None = None,
    progress: bool = True,
    timeout_s: float = 300.0,
    links_from: Profile | None = None,
) -> Profile:
    """Measure compute, memory and N-process collectives on this machine, all N processes at once.

    One device (a single-GPU machine) has no collective to time: its compute, memory and op overhead
    are measured, and the links and overlap are copied from ``links_from``, the profile of the
    cluster it stands for, each source saying so (``_one_device_profile``)."""
    threads = threads or threads_per_process(processes=devices)
    if devices == 1:
        if links_from is None:  # before any measuring, not after it
            raise ValueError("one device has no collective to measure; name the cluster's links with links_from")
        comm_sweep = CommSweep(collectives=(), overlap=False)
    device = default_device()
    compute_sweep = compute_sweep or default_sweep(device)
    dtypes = supported_dtypes(device)
    job = compute_job(sweep=compute_sweep, dtypes=dtypes, model=model, batch=batch, device=device)
    bar = _progress() if progress else None
    with bar or nullcontext():
        tick = _phase_ticker(bar, job=job, devices=devices, sweep=comm_sweep)
        backend, per_rank = run_ranks(
            processes=devices, threads=threads, job=job, sweep=comm_sweep, timeout_s=timeout_s, on_tick=tick
        )
    rows, (copy_bw, mem_eff) = merge_compute(job, per_rank)
    how = f"all {devices} processes computing at once, {threads} threads each, median over ranks"
    spec = device_spec(
        name=_device_name(device, threads),
        memory_bytes=_memory_bytes(device, devices),
        rows=rows,
        copy_bandwidth=copy_bw,
        memory_efficiency=mem_eff,
        threads=threads,
        how=how,
        overhead=merge_overhead(per_rank, how=how),
    )
    host = measure_host(device=device, devices=devices, threads=threads)  # the host offload uses (host_offload.py)
    if devices == 1:
        one = _one_device_profile(spec, links_from=links_from, name=name, backend=backend, threads=threads, how=how)
        return replace(one, host=host)
    points = merge_collectives({r: res.collectives for r, res in per_rank.items()}, processes=devices, sweep=comm_sweep)
    link = link_spec(
        name=f"{backend} between {devices} local processes on {platform.node()}", points=points, backend=backend
    )
    overlap = comm_overlap(per_rank, backend=backend, threads=threads) if comm_sweep.overlap else CommOverlap()
    return Profile(
        name=name or f"{platform.node()}-{backend}",
        device=spec,
        devices_per_node=devices,
        intra_node=link,
        inter_node=None,
        backend=backend,
        threads=threads,
        comm_overlap=overlap,
        host=host,
        description=f"Measured by `autoplan profile --devices {devices}` on {platform.node()} "
        f"({device.type}, dtypes {', '.join(dtypes)}; compute timed with {how}).",
    )


def _one_device_profile(
    spec: DeviceSpec, *, links_from: Profile, name: str | None, backend: str, threads: int, how: str
) -> Profile:
    """This device's measured numbers with ``links_from``'s links, overlap and node size."""
    note = f"copied from profile '{links_from.name}': one device here has no link to measure"
    return Profile(
        name=name or f"{platform.node()}-{backend}-1",
        device=spec,
        devices_per_node=links_from.devices_per_node,
        intra_node=_copied_link(links_from.intra_node, note),
        inter_node=_copied_link(links_from.inter_node, note),
        backend=links_from.backend,
        threads=threads,
        comm_overlap=replace(links_from.comm_overlap, source=f"{links_from.comm_overlap.source} ({note})"),
        description=f"Device measured by `autoplan profile --devices 1` on {platform.node()} (compute timed with "
        f"{how}); links, overlap and devices_per_node {note}.",
    )


def _copied_link(link: LinkSpec | None, note: str) -> LinkSpec | None:
    return None if link is None else replace(link, name=f"{link.name} ({note})")


def comm_overlap(per_rank: dict[int, RankResult], *, backend: str, threads: int) -> CommOverlap:
    """The measured overlap efficiency from every rank's (t_comp, t_comm, t_both) (overlap.py)."""
    from autoplan.profile.measure.build import measured_source

    compute_s, comm_s, both_s = merge_overlap([r.overlap for r in per_rank.values()])
    source = measured_source(
        f"{len(per_rank)} processes, {threads} threads each: matmuls alone, a 25 MB {backend} all_reduce "
        f"alone, both at once (async_op); (t_comp + t_comm - t_both) / min(t_comp, t_comm)"
    )
    return CommOverlap(
        efficiency=overlap_efficiency(compute_s=compute_s, comm_s=comm_s, both_s=both_s),
        source=source,
        compute_s=compute_s,
        comm_s=comm_s,
        both_s=both_s,
    )


def measure_comm_overlap(*, devices: int = 2, threads: int | None = None, timeout_s: float = 300.0) -> CommOverlap:
    """Only the overlap test (no compute or collective sweep): to refresh ``comm_overlap`` of a profile."""
    threads = threads or threads_per_process(processes=devices)
    backend, per_rank = run_ranks(
        processes=devices, threads=threads, job=ComputeJob(), sweep=CommSweep(collectives=()), timeout_s=timeout_s
    )
    return comm_overlap(per_rank, backend=backend, threads=threads)


def measure_op_overhead(
    *,
    devices: int = 2,
    threads: int | None = None,
    budget_s: float = DEFAULT_SWEEP.overhead_budget_s,
    timeout_s: float = 300.0,
) -> OpOverhead:
    """Only the op-overhead test (overhead.py), all ``devices`` processes at once: to refresh
    ``device.op_overhead`` of a profile. One process alone: ``overhead.time_op_overhead``."""
    threads = threads or threads_per_process(processes=devices)
    _, per_rank = run_ranks(
        processes=devices,
        threads=threads,
        job=ComputeJob(overhead_budget_s=budget_s),
        sweep=CommSweep(collectives=(), overlap=False),
        timeout_s=timeout_s,
    )
    return merge_overhead(per_rank, how=f"all {devices} processes at once, {threads} threads each, median over ranks")


def merge_overhead(per_rank: dict[int, RankResult], *, how: str) -> OpOverhead | None:
    """The median over ranks of each rank's (forward_s, backward_s); None when not measured."""
    timed = [result.op_overhead for result in per_rank.values() if result.op_overhead is not None]
    if not timed:
        return None
    return op_overhead(
        forward_s=statistics.median(t[0] for t in timed), backward_s=statistics.median(t[1] for t in timed), how=how
    )


def compute_job(
    *,
    sweep: ComputeSweep,
    dtypes: list[str],
    model: str | os.PathLike | None,
    batch: int | None,
    device: torch.device | None = None,
) -> ComputeJob:
    """The sweep in every dtype (compute.dtype_specs: fp8 times its matmuls only; grouped GEMMs run on
    ``torch._grouped_mm`` where it runs on ``device`` in that dtype), then (with a model) its ops in
    the first dtype."""
    device = device or torch.device("cpu")
    items = [(s, dtype) for dtype in dtypes for s in dtype_specs(sweep, dtype_name=dtype, device=device)]
    if model is not None:
        from autoplan.profile.measure.optable import model_specs

        items += [(s, dtypes[0]) for s in model_specs(model_path=Path(model), batch=batch or 1)]
    return ComputeJob(
        items=tuple(items),
        budget_s=sweep.budget_s,
        memory_bytes=sweep.memory_bytes,
        overhead_budget_s=sweep.overhead_budget_s,
    )


def merge_compute(
    job: ComputeJob, per_rank: dict[int, RankResult]
) -> tuple[list[OpTiming], tuple[float, float] | None]:
    """Rows with the median over ranks of each rank's time, and the median memory numbers
    (None when the job timed no memory kernels)."""
    rows = []
    for i, (case_spec, dtype) in enumerate(job.items):
        case = make_case(case_spec)
        time_s = statistics.median(result.compute_s[i] for result in per_rank.values())
        rows.append(OpTiming(op=case.op_class, shape=case.shape, dtype=dtype, time_s=time_s, flops=case.flops))
    memory = [result.memory for result in per_rank.values() if result.memory is not None]
    if not memory:
        return rows, None
    return rows, (statistics.median(m[0] for m in memory), statistics.median(m[1] for m in memory))


def _progress() -> Progress:
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=Console(stderr=True),
    )


def _phase_ticker(bar: Progress | None, *, job: ComputeJob, devices: int, sweep: CommSweep):
    """A progress task per phase (compute, memory, collectives), advanced by rank 0's ticks."""
    if bar is None:
        return None
    totals = {
        "compute": len(job.items),
        "memory": 1,
        "overhead": 1,
        "collectives": len(sweep.collectives) * len(sweep.sizes()),
        "overlap": int(sweep.overlap),
    }
    labels = {
        "compute": f"compute x{devices} at once",
        "memory": f"memory x{devices} at once",
        "overhead": f"op overhead x{devices} at once",
        "collectives": f"collectives x{devices}",
        "overlap": f"overlap x{devices}",
    }
    tasks = {phase: bar.add_task(labels[phase], total=total) for phase, total in totals.items() if total}
    return lambda phase: bar.advance(tasks[phase])


def _device_name(device: torch.device, threads: int) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"{cpu_model() or 'CPU'} ({threads} threads)"


def _memory_bytes(device: torch.device, devices: int) -> int:
    """GPU memory, or this machine's RAM shared evenly between the N CPU ranks."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // devices
