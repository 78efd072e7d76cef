"""examples/lora_llama.py (peft's LoRA adapters on examples/llama.py) traces with its base frozen, and
its plan holds less than the same model trained whole (docs/cost-model.md, "Frozen parameters")."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autoplan.cli import main
from autoplan.trace import trace_model_file
from autoplan.types.graph import Graph

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "lora_llama.py"


def _planned(tmp_path: Path, name: str) -> tuple[Graph, dict]:
    """`autoplan plan` of the example: the graph it traced (the plan folder's graph.json) and its prediction."""
    out = tmp_path / name
    args = ["plan", str(EXAMPLE), "--profile", "cpu-gloo", "--devices", "2", "--batch", "4", "--out", str(out)]
    assert main(args + ["--fix", "dp=2,zero=1"]) == 0
    return Graph.load(out / "graph.json"), json.loads((out / "plan.json").read_text())["predicted"]


def test_lora_trains_its_adapters_only_and_plans_lighter_than_the_whole_model(tmp_path, monkeypatch):
    pytest.importorskip("peft")
    lora, lora_plan = _planned(tmp_path, "lora")
    assert 0 < lora.trainable_param_count < 0.1 * lora.param_count
    monkeypatch.setenv("AUTOPLAN_LORA_RANK", "0")  # the same model, every weight trained
    whole, whole_plan = _planned(tmp_path, "whole")
    assert whole.trainable_param_count == whole.param_count
    assert lora_plan["peak_memory_bytes"] < whole_plan["peak_memory_bytes"]
    lora_states, whole_states = lora_plan["memory"], whole_plan["memory"]
    assert lora_states["grads_bytes"] < 0.1 * whole_states["grads_bytes"]
    assert lora_states["optimizer_bytes"] < 0.1 * whole_states["optimizer_bytes"]
    assert lora_plan["breakdown"]["optimizer_s"] < whole_plan["breakdown"]["optimizer_s"]


def test_peft_dtype_assertions_are_not_where_an_adapted_projection_leaves_the_block(monkeypatch):
    """peft casts each adapted output back with ``.to(dtype)``, which traces as an assertion node that
    outputs nothing: the tensor-parallel analysis must not take it for the residual stream (it priced
    every colwise base projection an all-gather of its output, forward and backward)."""
    pytest.importorskip("peft")
    from autoplan.cost.tp.block import analyse_block

    for field, value in dict(N_LAYERS=2, DIM=64, FFN_DIM=128, SEQ_LEN=16, VOCAB_SIZE=256).items():
        monkeypatch.setenv(f"AUTOPLAN_LLAMA_{field}", str(value))
    graph = trace_model_file(EXAMPLE, 2)
    block = analyse_block(graph, graph.layers[0])
    assert any(node.op == "other" and not node.output_bytes for node in block.nodes)
    reaching = [graph.node(name).module for name in block.sinks]
    # the base and lora_B of the two projections back into the stream, and nothing else
    assert len(reaching) == 4 and all(".attention.wo." in m or ".feed_forward.w2." in m for m in reaching), reaching
