"""Eager attention found by structure in traced HF models, priced as one fused kernel under a runtime
that brings its own (megatron, torchtitan), and explain's line on what SDPA would save."""

from __future__ import annotations

import os

import pytest
import torch

transformers = pytest.importorskip("transformers")

from autoplan.cost import CostModel  # noqa: E402
from autoplan.cost.compute.eager_attention import find_eager_attention, fused_attention_graph  # noqa: E402
from autoplan.profile import load_profile  # noqa: E402
from autoplan.report.explain import explain  # noqa: E402
from autoplan.solve.api import plan_graph  # noqa: E402
from autoplan.trace import trace, trace_model_file  # noqa: E402
from autoplan.types import Plan  # noqa: E402

EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "..", "..", "examples")


def _llama(impl: str, *, seq: int = 64):
    config = transformers.LlamaConfig(
        num_hidden_layers=2,
        hidden_size=128,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=256,
        vocab_size=128,
        max_position_embeddings=seq,
        use_cache=False,
        attn_implementation=impl,
    )
    return trace(transformers.LlamaForCausalLM(config), (torch.randint(0, 128, (2, seq)),))


@pytest.fixture(scope="module")
def eager():
    return _llama("eager")


@pytest.fixture(scope="module")
def sdpa():
    return _llama("sdpa", seq=1024)  # several 128-key tiles, so a causal kernel skips some


def _plan(runtime: str, profile: str = "dgx-h100") -> Plan:
    return Plan(
        devices=1,
        dp=1,
        tp=1,
        pp=1,
        micro_batch_size=2,
        num_microbatches=1,
        profile=profile,
        runtime=runtime,
        precision="bf16",
    )


def test_finds_one_eager_attention_per_block_with_its_gqa_heads(eager):
    found = find_eager_attention(eager)
    assert len(found) == 2 and all(m.masked for m in found)
    fused = fused_attention_graph(eager)
    attention = [n for n in fused.nodes if n.op == "attention"]
    shapes = [(n.attrs["num_heads"], n.attrs["num_kv_heads"], n.attrs["q_len"], n.attrs["causal"]) for n in attention]
    assert shapes == [(4, 2, 64, True)] * 2
    # model FLOPs are kept: QK + PV move into the fused node, nothing else counted any
    assert fused.fwd_flops == eager.fwd_flops and fused.bwd_flops == eager.bwd_flops
    assert all("softmax" not in n.target for n in fused.nodes if n.layer)


def test_sdpa_attention_is_not_mistaken_for_eager(sdpa):
    assert find_eager_attention(sdpa) == [] and fused_attention_graph(sdpa) is None


def test_a_runtimes_own_attention_runs_hfs_positional_mask_causal(sdpa):
    # HF's traced SDPA gets an explicit mask built from positions alone: priced whole as traced, causal
    # (its tiles skipped) under a runtime that brings its own attention module
    assert all(n.attrs["has_mask"] and not n.attrs["causal"] for n in sdpa.nodes if n.op == "attention")
    model = CostModel(sdpa, load_profile("dgx-h100"))
    own = [n for n in model.fused_attention.for_runtime("torchtitan").graph.nodes if n.op == "attention"]
    assert len(own) == 2 and all(n.attrs["causal"] and not n.attrs["has_mask"] for n in own)
    autoplan, torchtitan = model.estimate(_plan("autoplan")), model.estimate(_plan("torchtitan"))
    assert torchtitan.step_time_s < autoplan.step_time_s
    # Megatron runs it through Transformer Engine's kernel (cuDNN on Hopper): its own, faster curve
    assert model.estimate(_plan("megatron")).step_time_s < torchtitan.step_time_s


def test_a_fused_attention_runtime_prices_the_fused_kernel(eager):
    h100 = load_profile("dgx-h100")
    model = CostModel(eager, h100)
    megatron, autoplan = model.estimate(_plan("megatron")), model.estimate(_plan("autoplan"))
    torchtitan = model.estimate(_plan("torchtitan"))
    # deepspeed runs the graph as given, the whole model cast to bf16 as torchtitan's FSDP2 casts it
    assert (
        torchtitan.step_time_s == CostModel(fused_attention_graph(eager), h100).estimate(_plan("deepspeed")).step_time_s
    )
    assert torchtitan.step_time_s != autoplan.step_time_s
    # the scores are no longer kept for the backward
    assert megatron.peak_memory_bytes < autoplan.peak_memory_bytes
    # both run the code as written (the same FLOPs); DeepSpeed's bf16 engine casts the whole model where
    # autoplan's autocast keeps the residual stream fp32 (cost/compute/dtypes.py): only autoplan's bytes grow
    deepspeed = model.estimate(_plan("deepspeed"))
    assert deepspeed.extra["hardware_flops"] == autoplan.extra["hardware_flops"]
    assert deepspeed.step_time_s < autoplan.step_time_s


def test_gpt_oss_attention_with_sinks_is_found(monkeypatch):
    sizes = dict(LAYERS=2, DIM=64, HEADS=4, KV_HEADS=2, HEAD_DIM=16, FFN=64, EXPERTS=4, TOP_K=2, VOCAB=128, SEQ=32)
    for name, value in sizes.items():
        monkeypatch.setenv(f"AUTOPLAN_HF_GPT_OSS_{name}", str(value))
    graph = trace_model_file(os.path.join(EXAMPLES, "hf_gpt_oss.py"), 2)
    found = find_eager_attention(graph)
    assert len(found) == 2 and all(m.masked for m in found)  # the sinks' parameter path is no mask
    fused = fused_attention_graph(graph)
    assert sum(n.param_count for n in fused.nodes) == sum(n.param_count for n in graph.nodes)  # sinks kept


def test_explain_says_what_sdpa_would_save(eager, sdpa):
    cpu = load_profile("cpu-gloo")
    result = plan_graph(eager, devices=1, profile=cpu, batch_size=2)
    line = explain(result, graph=eager, profile=cpu, rivals=1, sensitivity=False).attention
    assert line.startswith("Eager attention: 2 attention(s)") and "attn_implementation='sdpa'" in line
    fused = CostModel(fused_attention_graph(eager), cpu).estimate(result.best)
    saved_s = result.best_cost.step_time_s - fused.step_time_s
    assert f"{100 * abs(saved_s) / result.best_cost.step_time_s:.1f}%" in line
    assert ("would save" if saved_s >= 0 else "would add") in line
    plain = plan_graph(sdpa, devices=1, profile=cpu, batch_size=2)
    assert explain(plain, graph=sdpa, profile=cpu, rivals=1, sensitivity=False).attention == ""
