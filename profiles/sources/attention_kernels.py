"""Fused attention efficiency curves of the kernels each runtime runs on Hopper, from one published benchmark.

Imported by fit_published.py (``python profiles/sources/fit_published.py`` rewrites the profiles).

Shah et al. 2024 (FlashAttention-3, arXiv 2407.08608), figures "Attention forward speed, head dim 128
(H100 80GB SXM5)" and "Attention backward speed, head dim 128": BF16, no causal mask, batch x seq =
16k tokens, 16 heads of 128 (hidden 2048), seq 512 .. 16k, one bar per kernel. The paper counts the
forward as 4 b s^2 h d FLOPs and the backward as 2.5x that (the recomputed Q K^T included), the FLOPs
autoplan prices (autoplan/cost/compute/roofline.py ``executed_flops``). Each point is one kernel call,
fitted as eff(F) = a F / (F + F_half) (autoplan.profile.fit). Which bar is which runtime's kernel:

* ``attention``, ``attention_backward``: FlashAttention-2, the kernel PyTorch's SDPA flash backend
  runs (aten/src/ATen/native/transformers/cuda/flash_attn is FA2): autoplan's executor, torchtitan.
* ``attention_te``, ``attention_te_backward``: cuDNN's fused attention, Transformer Engine's default
  backend on Hopper (NVTE_FUSED_ATTN): Megatron-Core.

H200 has the same SMs and clocks as H100 (NVIDIA H200 datasheet) and attention is compute-bound, so
it uses the H100 figures. A100: FlashAttention-2, the Azure benchmarking guide's one point
(fit_published.py ``build``).
"""

from __future__ import annotations

from autoplan.profile.fit import fit_efficiency
from autoplan.types.profile import Efficiency

FA3_PAPER = "Shah et al. 2024 FlashAttention-3 (arXiv 2407.08608), attention {what} speed, head dim 128, H100 80GB SXM5"
SEQS = (512, 1024, 2048, 4096, 8192, 16384)
#: TFLOP/s per sequence length in SEQS, BF16, non-causal (module docstring), by (kernel, direction)
H100_HD128_TFLOPS = {
    ("FlashAttention-2", "forward"): (309, 350, 362, 368, 370, 370),
    ("FlashAttention-2", "backward"): (214, 260, 291, 310, 318, 322),
    ("cuDNN", "forward"): (497, 574, 617, 609, 600, 595),
    ("cuDNN", "backward"): (305, 408, 465, 499, 518, 516),
}
#: profile op class -> (kernel, direction)
CLASSES = {
    "attention": ("FlashAttention-2", "forward"),
    "attention_backward": ("FlashAttention-2", "backward"),
    "attention_te": ("cuDNN", "forward"),
    "attention_te_backward": ("cuDNN", "backward"),
}
TOKENS, HEADS, HEAD_DIM = 16384, 16, 128
BACKWARD_FLOPS_PER_FORWARD = 2.5  # FA2/FA3 benchmark scripts' count: 4 backward GEMMs + the recomputed Q K^T


def forward_flops(seq: int) -> float:
    """4 b s^2 h d with b = 16k tokens / s (the paper's shapes)."""
    return 4.0 * (TOKENS // seq) * seq * seq * HEADS * HEAD_DIM


def hopper_curves(peak_bf16_flops: float) -> dict[str, Efficiency]:
    """Each op class of :data:`CLASSES` fitted to its kernel's bars."""
    return {op_class: _fit(kernel, what, peak_bf16_flops) for op_class, (kernel, what) in CLASSES.items()}


def _fit(kernel: str, what: str, peak_bf16_flops: float) -> Efficiency:
    tflops = H100_HD128_TFLOPS[kernel, what]
    per_call = BACKWARD_FLOPS_PER_FORWARD if what == "backward" else 1.0
    flops = [forward_flops(seq) * per_call for seq in SEQS]
    times = [f / (rate * 1e12) for f, rate in zip(flops, tflops)]
    a, f_half = fit_efficiency(flops=flops, time_s=times, peak_flops=[peak_bf16_flops] * len(flops))
    points = ", ".join(f"{seq}: {rate}" for seq, rate in zip(SEQS, tflops))
    source = FA3_PAPER.format(what=what) + f", {kernel} bars (seq: TFLOP/s {points}), fitted a F/(F + F_half)"
    return Efficiency(max_efficiency=a, half_saturation_flops=f_half, source=source)
