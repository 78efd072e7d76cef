"""The profile's ``host`` section measured on this machine (docs/profile-format.md, "The host section").

Three figures per device, in this process with one device's share of the threads (the other ranks idle):

- host memory: the machine's RAM over the devices (CPU ranks share it: their "host" is their own memory);
- link: bytes per second of one copy, host to device: ``LINK_BYTES`` from pinned host memory to the GPU
  on CUDA, else from one host tensor into another (what offload's copies are on a CPU rank), median of
  ``REPEATS`` after a warm-up;
- CPU Adam: ``ADAM_PARAMS`` fp32 parameters stepped by ``torch.optim.Adam`` (its default foreach
  implementation, what the executor's offloaded step runs), parameters / median step seconds.
"""

from __future__ import annotations

import os
import platform
import statistics
import time
from datetime import date

import torch

from autoplan.profile.host import cpu_model
from autoplan.types.host_spec import HostProfile

LINK_BYTES = 64 * 2**20
ADAM_PARAMS = 2**22
REPEATS = 5


def measure_host(
    *, device: torch.device, devices: int, threads: int, link_bytes: int = LINK_BYTES, adam_params: int = ADAM_PARAMS
) -> HostProfile:
    """This machine's host section (module docstring), ``threads`` intra-op threads."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        link, adam = _link_bytes_per_s(device, link_bytes), _adam_params_per_s(adam_params)
    finally:
        torch.set_num_threads(before)
    what = torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_model()
    where = f"measured on {platform.node()} ({what}) on {date.today().isoformat()} with torch {torch.__version__}"
    return HostProfile(
        host_memory_bytes_per_device=os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / devices,
        link_bytes_per_s=link,
        adam_params_per_s=adam,
        source=f"{where}: physical memory (sysconf) over {devices} devices",
        link_source=f"{where}: median of {REPEATS} copies of {link_bytes / 2**20:.0f} MiB host to "
        f"{'device (pinned)' if device.type == 'cuda' else 'host'}, {threads} threads",
        adam_source=f"{where}: median of {REPEATS} torch.optim.Adam steps over {adam_params} fp32 parameters, "
        f"{threads} threads",
    )


def _median_s(run, *, sync=lambda: None) -> float:
    run()
    sync()
    times = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        run()
        sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _link_bytes_per_s(device: torch.device, size: int) -> float:
    cuda = device.type == "cuda"
    src = torch.ones(size // 4, dtype=torch.float32, pin_memory=cuda)
    dst = torch.empty(size // 4, dtype=torch.float32, device=device if cuda else "cpu")
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    return size / _median_s(lambda: dst.copy_(src, non_blocking=cuda), sync=sync)


def _adam_params_per_s(count: int) -> float:
    param = torch.nn.Parameter(torch.zeros(count))
    param.grad = torch.full_like(param, 1e-3)
    optimizer = torch.optim.Adam([param], lr=1e-3)
    return count / _median_s(optimizer.step)
