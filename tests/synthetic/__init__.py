"""The tests' one fixtures package: synthetic transformer graphs and cluster profiles, built from
the data types alone, for every test tier.

They let the planner be tested and demonstrated without torch tracing: the graph has the
shape the tracer produces for a GPT block (norm -> q/k/v -> attention -> o -> residual add ->
norm -> fc1 -> gelu -> fc2 -> residual add), with FLOPs and bytes from the usual formulas
(a linear of m rows does 2*m*in*out FLOPs forward and twice that backward; attention
4*b*s^2*h forward; Narayanan et al. SC'21, section 5.1). The profile numbers are an
A100-SXM4-80GB node (NVIDIA A100 datasheet: 312 TFLOP/s bf16, 19.5 TFLOP/s fp32, 2.0 TB/s
HBM2e) with NVLink/InfiniBand bus bandwidths in the range nccl-tests reports; they are
illustrative defaults for tests, not a calibrated profile (use profiles/*.yaml for that).
"""

from synthetic.graphs import canonical_graph, gpt_graph, synthetic_gpt
from synthetic.profiles import a100_profile, synthetic_host, synthetic_profile

__all__ = ["a100_profile", "canonical_graph", "gpt_graph", "synthetic_gpt", "synthetic_profile", "synthetic_host"]
