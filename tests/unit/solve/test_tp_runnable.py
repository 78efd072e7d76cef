"""Tensor parallelism is offered only where the executor can run it: the trace records every op
DTensor has no strategy for (autoplan/trace/dtensor_reach.py), and the planner neither prices
tp > 1 for such a model nor accepts a tp pin on it (autoplan/solve/tp_runnable.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from autoplan.cli import main
from autoplan.errors import PlanError
from autoplan.solve.api import plan_graph
from autoplan.trace import trace_model_file

ROOT = Path(__file__).resolve().parents[3]
LSTM = ROOT / "tests/corpus/lstm_lm.py"


@pytest.fixture(scope="module")
def lstm_graph():
    return trace_model_file(LSTM, 8)


def _lacking(graph) -> dict[str, list[str]]:
    return {node.module: node.attrs["dtensor_lacks"] for node in graph.nodes if node.attrs.get("dtensor_lacks")}


def test_the_trace_names_the_ops_dtensor_cannot_run_and_only_those(lstm_graph):
    assert _lacking(lstm_graph) == {"lstm": ["aten.mkldnn_rnn_layer.default", "aten.mkldnn_rnn_layer_backward.default"]}
    one_block = trace_model_file(ROOT / "tests/odd_models/one_block.py", 8)  # Linear, LayerNorm, tanh: all run
    assert _lacking(one_block) == {}


def test_the_trace_keeps_onednn_on_whoever_turned_it_off(monkeypatch):
    """A process that ran a low-precision RNN where oneDNN has no kernel for it turns oneDNN off
    (execute/precision.py); a trace after it still finds the ops a CPU run executes, and leaves the flag off."""
    monkeypatch.setattr(torch.backends.mkldnn, "enabled", False)
    lacking = _lacking(trace_model_file(LSTM, 8))
    assert lacking == {"lstm": ["aten.mkldnn_rnn_layer.default", "aten.mkldnn_rnn_layer_backward.default"]}
    assert not torch.backends.mkldnn.enabled


def test_a_model_dtensor_cannot_run_is_never_offered_tp(lstm_graph):
    result = plan_graph(lstm_graph, devices=2, profile="cpu-gloo")
    assert result.candidates and all(c.config["tp"] == 1 for c in result.candidates)  # none priced, none pruned
    one_block = plan_graph(trace_model_file(ROOT / "tests/odd_models/one_block.py", 8), devices=2,
                           profile="cpu-gloo", fix="tp=2")  # fmt: skip
    assert one_block.best.tp == 2  # the limit comes from the model's ops, not from the planner


def test_a_tp_pin_on_such_a_model_is_one_sentence_naming_the_op(lstm_graph):
    refusal = r"--fix tp=2 cannot run on this model: .*aten\.mkldnn_rnn_layer\.default.*'lstm' \(LSTM\)"
    with pytest.raises(PlanError, match=refusal):
        plan_graph(lstm_graph, devices=2, profile="cpu-gloo", fix="tp=2")


def test_the_cli_refuses_the_pin_with_exit_2(tmp_path, capsys):
    code = main(["plan", str(LSTM), "--devices", "2", "--profile", "cpu-gloo", "--batch", "8", "--fix", "tp=2",
                 "--out", str(tmp_path)])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert "autoplan: error: --fix tp=2 cannot run on this model" in err and "use tp=1." in err
