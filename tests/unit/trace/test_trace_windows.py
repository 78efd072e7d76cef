"""Sliding-window attention read from HF attention modules (trace/windows.py) and priced at the tiles
a fused kernel visits under a runtime that brings its own attention."""

from __future__ import annotations

import os
from dataclasses import replace

import pytest
import torch

transformers = pytest.importorskip("transformers")

from autoplan.cost import CostModel  # noqa: E402
from autoplan.profile import load_profile  # noqa: E402
from autoplan.trace import trace, trace_model_file  # noqa: E402
from autoplan.types import Plan  # noqa: E402

EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "..", "..", "examples")
SEQ = 512  # four 128-key tiles: a 128-token window visits fewer than causal does


def _tiny(config_class, model_class, **extra):
    config = config_class(
        num_hidden_layers=2,
        hidden_size=64,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=128,
        vocab_size=128,
        max_position_embeddings=SEQ,
        use_cache=False,
        attn_implementation="sdpa",
        **extra,
    )
    return trace(model_class(config), (torch.randint(0, 128, (2, SEQ)),))


@pytest.fixture(scope="module")
def gpt_oss():
    sizes = dict(LAYERS=2, DIM=64, HEADS=4, KV_HEADS=2, HEAD_DIM=16, FFN=64, EXPERTS=4, TOP_K=2, VOCAB=128, SEQ=SEQ)
    with pytest.MonkeyPatch.context() as patch:
        for name, value in sizes.items():
            patch.setenv(f"AUTOPLAN_HF_GPT_OSS_{name}", str(value))
        return trace_model_file(os.path.join(EXAMPLES, "hf_gpt_oss.py"), 2)


def _plan(runtime: str) -> Plan:
    return Plan(
        devices=1, dp=1, tp=1, pp=1, micro_batch_size=2, num_microbatches=1,
        profile="dgx-h100", runtime=runtime, precision="bf16",
    )  # fmt: skip


def _unwindowed(graph):
    nodes = [replace(n, attrs={k: v for k, v in n.attrs.items() if k != "window"}) for n in graph.nodes]
    return replace(graph, nodes=nodes)


def _windows(graph, op: str) -> list[int]:
    return [n.attrs.get("window", 0) for n in graph.nodes if n.op == op and not n.param_count]


def test_gpt_oss_alternating_layers_are_windowed_and_grouped_apart(gpt_oss):
    # layer_types alternates sliding/full: QK and PV of layer 0 see 128 keys, layer 1's all
    assert _windows(gpt_oss, "matmul") == [128, 128, 0, 0]
    assert sorted(g.layers for g in gpt_oss.groups) == [["model.layers.0"], ["model.layers.1"]]
    fused = CostModel(gpt_oss, load_profile("dgx-h100")).fused_attention.for_runtime("megatron").graph
    assert _windows(fused, "attention") == [128, 0]


def test_a_window_prices_fewer_tiles_under_a_runtimes_own_attention(gpt_oss):
    h100 = load_profile("dgx-h100")
    for runtime in ("megatron", "torchtitan"):
        windowed = CostModel(gpt_oss, h100).estimate(_plan(runtime)).step_time_s
        assert windowed < CostModel(_unwindowed(gpt_oss), h100).estimate(_plan(runtime)).step_time_s
    # as written (eager, autoplan's executor) every score is computed: the window saves nothing
    as_written = CostModel(gpt_oss, h100).estimate(_plan("autoplan")).step_time_s
    assert as_written == CostModel(_unwindowed(gpt_oss), h100).estimate(_plan("autoplan")).step_time_s


def test_mistral_windows_every_layer_from_its_config():
    graph = _tiny(transformers.MistralConfig, transformers.MistralForCausalLM, sliding_window=128)
    assert _windows(graph, "attention") == [128, 128]
    h100 = load_profile("dgx-h100")
    windowed = CostModel(graph, h100).estimate(_plan("torchtitan")).step_time_s
    assert windowed < CostModel(_unwindowed(graph), h100).estimate(_plan("torchtitan")).step_time_s


def test_a_window_the_config_does_not_use_is_not_priced():
    # Qwen2 carries sliding_window in its config but runs full attention unless use_sliding_window
    graph = _tiny(transformers.Qwen2Config, transformers.Qwen2ForCausalLM, sliding_window=128)
    assert _windows(graph, "attention") == [0, 0]
    windowed = _tiny(
        transformers.Qwen2Config, transformers.Qwen2ForCausalLM, sliding_window=128, use_sliding_window=True,
        max_window_layers=1,
    )  # fmt: skip
    assert _windows(windowed, "attention") == [0, 128]  # layers from max_window_layers on slide
