"""Timing helpers shared by the compute and interconnect measurements.

Times are medians over repeats after one warm-up call. Accelerator work is asynchronous,
so every timed call ends with a device synchronize (``torch.accelerator.synchronize``),
which makes the same code correct on CPU and CUDA.
"""
from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

DTYPE_NAMES = {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def synchronize(device: torch.device) -> None:
    if device.type != "cpu":
        torch.accelerator.synchronize(device)


def median_time_s(fn: Callable[[], Any], *, device: torch.device, budget_s: float,
                  min_repeats: int = 3, max_repeats: int = 50) -> float:
    """Median seconds of ``fn()``: one warm-up, then repeats until ``budget_s`` is spent
    (but at least ``min_repeats`` and at most ``max_repeats``)."""
    fn()
    synchronize(device)
    times: list[float] = []
    started = time.perf_counter()
    while len(times) < max_repeats and (len(times) < min_repeats or time.perf_counter() - started < budget_s):
        t0 = time.perf_counter()
        fn()
        synchronize(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def available_cores() -> int:
    """CPU cores this process may run on (the affinity mask, not the machine's total)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def threads_per_process(*, processes: int) -> int:
    """A fixed intra-op thread count so that processes * threads <= available cores."""
    return max(1, available_cores() // max(1, processes))


def default_device() -> torch.device:
    """The first accelerator when one is present, else the CPU."""
    if torch.accelerator.is_available():
        return torch.accelerator.current_accelerator()
    return torch.device("cpu")


def supported_dtypes(device: torch.device) -> list[str]:
    """Dtypes worth sweeping on ``device``: fp32 and bf16 on CPU; tf32/fp16 on CUDA with tensor cores."""
    if device.type == "cuda":
        major, _ = torch.cuda.get_device_capability(device)
        dtypes = ["fp32", "fp16"] + (["tf32", "bf16"] if major >= 8 else [])
        return dtypes
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
