"""Issue 32's done-when checks on a Llama-2-7B shape on H100s: the planner splits a 128K-token
sequence over cp ranks, finds a plan at 1M tokens, and explain says why cp won.

The shape: 32 blocks, hidden 4096, 32 heads (MHA), causal SDPA, vocab 32000, and an MLP of two
4096 x 16512 matrices, the weights of Llama-2-7B's SwiGLU (3 x 4096 x 11008) in the synthetic
GPT's two-matrix block (tests/synthetic/graphs.py); no trace, so each search is the whole test.
"""

from __future__ import annotations

import pytest
from synthetic import synthetic_gpt

from autoplan.profile import load_profile
from autoplan.report.explain import explain
from autoplan.solve.api import plan_graph


def _llama2_7b(seq: int, batch: int):
    return synthetic_gpt(layers=32, hidden=4096, heads=32, vocab=32000, seq=seq, batch=batch, ffn=16512)


@pytest.fixture(scope="module")
def h100():
    return load_profile("dgx-h100")


@pytest.fixture(scope="module")
def at_128k(h100):
    graph = _llama2_7b(128 * 1024, 32)
    return graph, plan_graph(graph, devices=128, profile=h100, batch_size=32)


def test_128k_tokens_on_128_h100s_split_the_sequence(at_128k):
    _, result = at_128k
    best = result.best
    assert best.cp > 1 and best.dp * best.cp * best.tp * best.pp == 128
    assert result.best_cost.feasible and all(c.plan.cp > 1 for c in result.ranked()[:1])


def test_1m_tokens_on_1024_h100s_have_a_plan(h100):
    result = plan_graph(_llama2_7b(1024 * 1024, 4), devices=1024, profile=h100, batch_size=4)
    assert result.best is not None and result.best.cp > 1 and result.best_cost.feasible


def test_explain_says_why_cp_won(at_128k, h100):
    graph, result = at_128k
    why = explain(result, graph=graph, profile=h100, sensitivity=False).cp
    best = result.best
    assert why.startswith(f"cp={best.cp} ({best.cp_variant}) splits each sequence of 131072 tokens")
    assert "GiB per device" in why and "exposed KV exchange" in why and "\n" not in why
