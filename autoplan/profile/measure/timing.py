"""Timing helpers shared by the compute and interconnect measurements.

Times are medians over repeats after one warm-up call. Accelerator work is asynchronous,
so every timed call ends with a device synchronize (``torch.accelerator.synchronize``),
which makes the same code correct on CPU and CUDA.

Concurrent timing (``concurrent=True``, inside a process group): every rank times the same
kernel at the same moment, as the executor's ranks compute at once. The ranks start
together (a barrier after the warm-up) and a rank that has its samples keeps running the
kernel, untimed, until every rank has its own (an asynchronous barrier it polls), so no
rank's samples are taken while another rank idles. Cores, caches and memory bandwidth a CPU
node's ranks share, or the host a GPU node's ranks share, are then in every sample.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

DTYPE_NAMES = {
    "fp32": torch.float32,
    "tf32": torch.float32,
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
    "fp8": torch.float8_e4m3fn,
}
#: dtypes timed with scaled GEMMs only (compute.matmul_case); no other op class runs in them
FP8_DTYPES = (torch.float8_e4m3fn,)


def synchronize(device: torch.device) -> None:
    if device.type != "cpu":
        torch.accelerator.synchronize(device)


def median_time_s(
    fn: Callable[[], Any],
    *,
    device: torch.device,
    budget_s: float,
    min_repeats: int = 3,
    max_repeats: int = 50,
    concurrent: bool = False,
) -> float:
    """Median seconds of ``fn()``: one warm-up, then repeats until ``budget_s`` is spent
    (but at least ``min_repeats`` and at most ``max_repeats``). ``concurrent``: all ranks of
    the default process group time it together (module docstring)."""
    fn()
    synchronize(device)
    if concurrent:
        dist.barrier()
    times = _repeat(fn, device=device, budget_s=budget_s, min_repeats=min_repeats, max_repeats=max_repeats)
    if concurrent:
        _busy_until_all_done(fn, device=device)
    return statistics.median(times)


def _busy_until_all_done(fn: Callable[[], Any], *, device: torch.device) -> None:
    """Keep running ``fn`` (untimed) until every rank has entered the barrier."""
    work = dist.barrier(async_op=True)
    while not work.is_completed():
        fn()
        synchronize(device)
    work.wait()


def _repeat(
    fn: Callable[[], Any], *, device: torch.device, budget_s: float, min_repeats: int, max_repeats: int
) -> list[float]:
    times: list[float] = []
    started = time.perf_counter()
    while len(times) < max_repeats and (len(times) < min_repeats or time.perf_counter() - started < budget_s):
        t0 = time.perf_counter()
        fn()
        synchronize(device)
        times.append(time.perf_counter() - t0)
    return times


def default_device() -> torch.device:
    """The first accelerator when one is present, else the CPU."""
    if torch.accelerator.is_available():
        return torch.accelerator.current_accelerator()
    return torch.device("cpu")


def supported_dtypes(device: torch.device) -> list[str]:
    """Dtypes worth sweeping on ``device``: fp32 and bf16 on CPU; tf32/fp16 on CUDA with tensor cores,
    and fp8 (matmul only, ``torch._scaled_mm``) from compute capability 8.9 (Ada, Hopper and later)."""
    if device.type == "cuda":
        capability = torch.cuda.get_device_capability(device)
        dtypes = ["fp32", "fp16"] + (["tf32", "bf16"] if capability[0] >= 8 else [])
        return dtypes + (["fp8"] if capability >= (8, 9) and hasattr(torch, "_scaled_mm") else [])
    return ["fp32", "bf16"]


class tf32_mode:
    """Context manager that turns TF32 matmuls on for the 'tf32' dtype and off otherwise."""

    def __init__(self, dtype_name: str) -> None:
        self.enable = dtype_name == "tf32"

    def __enter__(self) -> None:
        self.saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
        torch.backends.cuda.matmul.allow_tf32 = self.enable
        torch.backends.cudnn.allow_tf32 = self.enable

    def __exit__(self, *exc: object) -> None:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = self.saved
