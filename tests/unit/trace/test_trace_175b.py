"""GPT-3 175B traces on meta/fake tensors: 96 identical layers in one group, the published
parameter count, and no real weights (peak RSS stays far below the 350 GB of fp16 weights)."""

from __future__ import annotations

import resource
from pathlib import Path

import pytest

from autoplan.trace import trace_model_file

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"


@pytest.mark.slow
def test_gpt3_175b_meta_trace():
    graph = trace_model_file(EXAMPLES / "gpt3_175b.py", 1536)
    assert len(graph.layers) == 96 and len(graph.groups) == 1 and len(graph.groups[0].layers) == 96
    assert 174e9 < graph.param_count < 176e9  # 175B (Brown et al. 2020 table 2.1)
    B, s, h, l, V = 1536, 2048, 12288, 96, 51200
    closed = 72 * B * s * l * h**2 * (1 + s / (6 * h)) + 6 * B * s * h * V  # Narayanan et al. eq. 3, no recompute
    assert abs(graph.step_flops - closed) / closed < 0.02
    peak_rss_bytes = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    assert peak_rss_bytes < 4 * 2**30
