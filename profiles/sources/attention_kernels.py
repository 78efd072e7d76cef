"""Fused attention efficiency curves of the kernel each GPU generation runs, from published benchmarks.

Imported by fit_published.py (``python profiles/sources/fit_published.py`` rewrites the profiles).

* H100/H200: FlashAttention-3 (Shah et al. 2024, arXiv 2407.08608, figures "Attention forward speed,
  head dim 128 (H100 80GB SXM5)" and "Attention backward speed, head dim 128"), BF16, no causal mask,
  batch x seq = 16k tokens, 16 heads of 128 (hidden 2048), seq 512 .. 16k. The paper counts the forward
  as 4 b s^2 h d FLOPs and the backward as 2.5x that (the recomputed Q K^T included), the FLOPs
  autoplan prices (autoplan/cost/compute/roofline.py ``executed_flops``). Each point is one kernel
  call, fitted as eff(F) = a F / (F + F_half) (autoplan.profile.fit). H200 has the same SMs and
  clocks as H100 (NVIDIA H200 datasheet) and attention is compute-bound, so H200 uses the H100
  figures. cuDNN's fused attention (Megatron/TE's default on Hopper) is within 10% of FA3 in the same
  figures (e.g. 600 vs 646 forward at 8k), so the FA3 curve stands for both.
* A100: FlashAttention-2, the Azure benchmarking guide's one point (fit_published.py ``build``).
"""

from __future__ import annotations

from autoplan.profile.fit import fit_efficiency
from autoplan.types.profile import Efficiency

FA3_PAPER = "Shah et al. 2024 FlashAttention-3 (arXiv 2407.08608), {what} speed, head dim 128, H100 80GB SXM5"
#: (seq, forward TFLOP/s, backward TFLOP/s) of FlashAttention-3, BF16, non-causal (module docstring)
FA3_H100_HD128 = [
    (512, 467, 316),
    (1024, 565, 424),
    (2048, 625, 501),
    (4096, 638, 542),
    (8192, 646, 559),
    (16384, 648, 561),
]
TOKENS, HEADS, HEAD_DIM = 16384, 16, 128
BACKWARD_FLOPS_PER_FORWARD = 2.5  # FA2/FA3 benchmark scripts' count: 4 backward GEMMs + the recomputed Q K^T


def forward_flops(seq: int) -> float:
    """4 b s^2 h d with b = 16k tokens / s (the papers' shapes)."""
    return 4.0 * (TOKENS // seq) * seq * seq * HEADS * HEAD_DIM


def fa3_curves(peak_bf16_flops: float) -> dict[str, Efficiency]:
    """{'attention': forward curve, 'attention_backward': backward curve} fitted to FA3's figures."""
    curves = {}
    for op_class, column, what, flops_per in (
        ("attention", 1, "forward", 1.0),
        ("attention_backward", 2, "backward", BACKWARD_FLOPS_PER_FORWARD),
    ):
        flops = [forward_flops(row[0]) * flops_per for row in FA3_H100_HD128]
        times = [f / (row[column] * 1e12) for f, row in zip(flops, FA3_H100_HD128)]
        a, f_half = fit_efficiency(flops=flops, time_s=times, peak_flops=[peak_bf16_flops] * len(flops))
        points = ", ".join(f"{row[0]}: {row[column]}" for row in FA3_H100_HD128)
        source = FA3_PAPER.format(what=what) + f" (seq: TFLOP/s {points}), fitted a F/(F + F_half)"
        curves[op_class] = Efficiency(max_efficiency=a, half_saturation_flops=f_half, source=source)
    return curves
