"""The BF16 grouped-GEMM efficiency curve of Hopper, from one published torch._grouped_mm measurement.

Imported by fit_published.py (``python profiles/sources/fit_published.py`` rewrites the profiles).

PyTorch PR #156203 ("[CUTLASS] [CUDA] SM100 GroupMM", github.com/pytorch/pytorch/pull/156203, June
2025) times ``torch._grouped_mm`` (the CUTLASS SM90 grouped kernel torchtitan's MoE runs) in BF16 on
an H200: 16 groups of M x N x K = 128000 x 7168 x 7168 in 298.6668 ms per call. One group's FLOPs
F = 2 M N K (the F cost/moe/experts.py evaluates the curve at), at the call's rate:

    rate = 16 x 2 M N K / t = 704.6 TFLOP/s,    a = rate / peak_bf16

The same PR's other shape (128 groups of 1 x 2048 x 7168: one row per group, 4.1462 ms) reads
each expert's weights once and computes almost nothing, so it is memory-bound (the cost model's
memory term) and says nothing about the curve's F_half; F_half is the matmul fit's (the same
launch and tail overhead argument as the A100 attention curve, fit_published.py ``build``).
H200 has the same SMs and clocks as H100 (NVIDIA H200 datasheet), so H100 uses the same figure.
No FP8 grouped figure is taken from here: FP8 grouped GEMMs keep the FP8 matmul curve.
"""

from __future__ import annotations

from autoplan.types.profile import Efficiency

PR = "PyTorch PR #156203 (github.com/pytorch/pytorch/pull/156203), torch._grouped_mm BF16 on H200"
GROUPS, M, N, K = 16, 128000, 7168, 7168
CALL_S = 298.6668e-3


def rate_flops_per_s() -> float:
    """The measured call's FLOP/s (module docstring)."""
    return GROUPS * 2.0 * M * N * K / CALL_S


def hopper_grouped_curve(peak_bf16_flops: float, matmul: Efficiency) -> Efficiency:
    """``grouped_matmul``: a from the PR's large call, F_half from ``matmul`` (module docstring)."""
    rate = rate_flops_per_s()
    source = (
        f"{PR}: {GROUPS} groups of {M}x{N}x{K} in {CALL_S * 1e3:.4f} ms = {rate / 1e12:.1f} TFLOP/s, "
        f"a = rate / BF16 peak; F_half from the matmul fit (launch/tail overhead)"
    )
    return Efficiency(
        max_efficiency=rate / peak_bf16_flops, half_saturation_flops=matmul.half_saturation_flops, source=source
    )
