"""Compute sweeps: matmul, attention (SDPA) and convolution per dtype, and memory bandwidth.

FLOPs counted per call (forward only, multiply-add = 2 FLOPs):
  matmul   (m x k) @ (k x n)                      2*m*n*k
  attention SDPA, q,k,v of (b, h, s, d), no mask   4*b*h*s*s*d   (Q K^T and P V)
  conv     3x3, stride 1, pad 1, c -> c channels   2*b*c*c*9*hw*hw
Memory bandwidth: a large copy moves 2 * bytes (read + write); memory-bound kernels
(add: 3 * bytes, gelu: 2 * bytes) give the achieved fraction of that bandwidth.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from autoplan.profile.measure.timing import DTYPE_NAMES, median_time_s, tf32_mode
from autoplan.types.profile import OpTiming

Builder = Callable[[torch.dtype, torch.device], Callable[[], Any]]


@dataclass(frozen=True)
class OpCase:
    op_class: str
    shape: str
    flops: float
    build: Builder


def matmul_case(*, m: int, n: int, k: int) -> OpCase:
    def build(dtype: torch.dtype, device: torch.device) -> Callable[[], Any]:
        a, b = torch.randn(m, k, dtype=dtype, device=device), torch.randn(k, n, dtype=dtype, device=device)
        return lambda: torch.mm(a, b)
    return OpCase("matmul", f"m={m},n={n},k={k}", 2.0 * m * n * k, build)


def attention_case(*, batch: int, heads: int, seq: int, head_dim: int) -> OpCase:
    def build(dtype: torch.dtype, device: torch.device) -> Callable[[], Any]:
        q, k, v = (torch.randn(batch, heads, seq, head_dim, dtype=dtype, device=device) for _ in range(3))
        return lambda: F.scaled_dot_product_attention(q, k, v)
    return OpCase("attention", f"b={batch},h={heads},s={seq},d={head_dim}", 4.0 * batch * heads * seq * seq * head_dim, build)


def conv_case(*, batch: int, channels: int, size: int) -> OpCase:
    def build(dtype: torch.dtype, device: torch.device) -> Callable[[], Any]:
        x = torch.randn(batch, channels, size, size, dtype=dtype, device=device)
        w = torch.randn(channels, channels, 3, 3, dtype=dtype, device=device)
        return lambda: F.conv2d(x, w, padding=1)
    return OpCase("conv", f"b={batch},c={channels},hw={size},k=3", 2.0 * batch * channels * channels * 9 * size * size, build)


@dataclass(frozen=True)
class ComputeSweep:
    """The shapes to time. Sizes grow geometrically so the fit sees both the overhead-bound
    and the saturated regime."""

    matmul: tuple[tuple[int, int, int], ...]
    attention: tuple[tuple[int, int, int, int], ...]
    conv: tuple[tuple[int, int, int], ...]
    budget_s: float = 0.25
    memory_bytes: int = 128 * 2**20

    def cases(self) -> list[OpCase]:
        return ([matmul_case(m=m, n=n, k=k) for m, n, k in self.matmul]
                + [attention_case(batch=b, heads=h, seq=s, head_dim=d) for b, h, s, d in self.attention]
                + [conv_case(batch=b, channels=c, size=hw) for b, c, hw in self.conv])


DEFAULT_SWEEP = ComputeSweep(
    matmul=((32, 32, 32), (64, 64, 64), (128, 128, 128), (256, 256, 256), (512, 512, 512), (1024, 1024, 1024),
            (2048, 256, 256), (256, 1024, 2048), (4096, 512, 128), (1024, 4096, 256), (64, 2048, 2048)),
    attention=((1, 4, 64, 64), (1, 4, 128, 64), (1, 8, 256, 64), (1, 8, 512, 64), (2, 8, 1024, 64)),
    conv=((1, 16, 16), (1, 32, 28), (2, 64, 28), (4, 64, 56)),
)

QUICK_SWEEP = ComputeSweep(
    matmul=((32, 32, 32), (128, 128, 128), (512, 512, 512)),
    attention=((1, 4, 64, 64), (1, 4, 256, 64)),
    conv=((1, 16, 16), (1, 32, 32)),
    budget_s=0.03,
    memory_bytes=16 * 2**20,
)


def time_case(case: OpCase, *, dtype_name: str, device: torch.device, budget_s: float) -> OpTiming:
    """Median time of one case in one dtype."""
    with tf32_mode(dtype_name), torch.no_grad():
        fn = case.build(DTYPE_NAMES[dtype_name], device)
        time_s = median_time_s(fn, device=device, budget_s=budget_s)
    return OpTiming(op=case.op_class, shape=case.shape, dtype=dtype_name, time_s=time_s, flops=case.flops)


def memory_bandwidth(*, device: torch.device, nbytes: int, budget_s: float) -> tuple[float, float]:
    """(copy bandwidth bytes/s, achieved fraction of it for memory-bound kernels)."""
    numel = nbytes // 4
    src, other, dst = (torch.randn(numel, device=device) for _ in range(3))
    with torch.no_grad():
        copy_bw = 2 * nbytes / median_time_s(lambda: dst.copy_(src), device=device, budget_s=budget_s)
        add_bw = 3 * nbytes / median_time_s(lambda: torch.add(src, other, out=dst), device=device, budget_s=budget_s)
        gelu_bw = 2 * nbytes / median_time_s(lambda: torch.nn.functional.gelu(src), device=device, budget_s=budget_s)
    return copy_bw, min(1.0, (add_bw + gelu_bw) / (2 * copy_bw))
