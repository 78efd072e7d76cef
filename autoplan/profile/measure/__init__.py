"""measure_profile: measure the machine it runs on and return a Profile.

Order: (1) fix the thread count T per process so that N * T <= cores, (2) time the
compute sweep and memory bandwidth in this process with T threads (the executor's ranks
run with the same T), (3) optionally time each traced op of a model, (4) spawn N processes
and time the collectives, (5) fit and assemble. Only this package touches torch.distributed.
"""
from __future__ import annotations

import os
import platform
from contextlib import nullcontext
from pathlib import Path

import torch
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from autoplan.profile.measure.build import device_spec, link_spec
from autoplan.profile.measure.collectives import CommSweep, measure_collectives
from autoplan.profile.measure.compute import DEFAULT_SWEEP, ComputeSweep, memory_bandwidth, time_case
from autoplan.profile.measure.timing import default_device, supported_dtypes, threads_per_process
from autoplan.types.profile import OpTiming, Profile

__all__ = ["measure_profile", "ComputeSweep", "CommSweep", "DEFAULT_SWEEP"]


def measure_profile(*, devices: int = 2, name: str | None = None, threads: int | None = None,
                    compute_sweep: ComputeSweep = DEFAULT_SWEEP, comm_sweep: CommSweep = CommSweep(),
                    model: str | os.PathLike | None = None, batch: int | None = None,
                    progress: bool = True, timeout_s: float = 300.0) -> Profile:
    """Measure compute, memory and N-process collectives on this machine."""
    threads = threads or threads_per_process(processes=devices)
    torch.set_num_threads(threads)
    device = default_device()
    dtypes = supported_dtypes(device)
    bar = _progress() if progress else None
    with bar or nullcontext():
        rows = _compute(device=device, dtypes=dtypes, sweep=compute_sweep, bar=bar)
        copy_bw, mem_eff = _memory(device=device, sweep=compute_sweep, bar=bar)
        if model is not None:
            from autoplan.profile.measure.optable import time_model_ops
            rows += time_model_ops(model_path=Path(model), batch=batch or 1, device=device, dtypes=dtypes[:1],
                                   budget_s=compute_sweep.budget_s, on_op=_ticker(bar, "model ops"))
        backend, points = _collectives(devices=devices, threads=threads, sweep=comm_sweep, timeout_s=timeout_s, bar=bar)
    spec = device_spec(name=_device_name(device, threads), memory_bytes=_memory_bytes(device, devices), rows=rows,
                       copy_bandwidth=copy_bw, memory_efficiency=mem_eff, threads=threads)
    link = link_spec(name=f"{backend} between {devices} local processes on {platform.node()}", points=points, backend=backend)
    return Profile(name=name or f"{platform.node()}-{backend}", device=spec, devices_per_node=devices, intra_node=link,
                   inter_node=None, backend=backend, threads=threads,
                   description=f"Measured by `autoplan profile --devices {devices}` on {platform.node()} "
                               f"({device.type}, {threads} threads per process, dtypes {', '.join(dtypes)}).")


def _progress() -> Progress:
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    console=Console(stderr=True))


def _ticker(bar: Progress | None, label: str, total: int | None = None):
    if bar is None:
        return lambda *_: None
    task = bar.add_task(label, total=total)
    return lambda *_: bar.advance(task)


def _compute(*, device: torch.device, dtypes: list[str], sweep: ComputeSweep, bar: Progress | None) -> list[OpTiming]:
    cases = sweep.cases()
    tick = _ticker(bar, "compute sweep", len(cases) * len(dtypes))
    rows = []
    for dtype in dtypes:
        for case in cases:
            rows.append(time_case(case, dtype_name=dtype, device=device, budget_s=sweep.budget_s))
            tick()
    return rows


def _memory(*, device: torch.device, sweep: ComputeSweep, bar: Progress | None) -> tuple[float, float]:
    tick = _ticker(bar, "memory bandwidth", 1)
    result = memory_bandwidth(device=device, nbytes=sweep.memory_bytes, budget_s=2 * sweep.budget_s)
    tick()
    return result


def _collectives(*, devices: int, threads: int, sweep: CommSweep, timeout_s: float, bar: Progress | None):
    tick = _ticker(bar, f"collectives x{devices}", len(sweep.collectives) * len(sweep.sizes()))
    return measure_collectives(processes=devices, threads=threads, sweep=sweep, timeout_s=timeout_s, on_tick=tick)


def _device_name(device: torch.device, threads: int) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    model = next((line.split(":", 1)[1].strip() for line in _cpuinfo() if line.startswith("model name")), platform.processor())
    return f"{model or 'CPU'} ({threads} threads)"


def _cpuinfo() -> list[str]:
    try:
        return Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return []


def _memory_bytes(device: torch.device, devices: int) -> int:
    """GPU memory, or this machine's RAM shared evenly between the N CPU ranks."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // devices
