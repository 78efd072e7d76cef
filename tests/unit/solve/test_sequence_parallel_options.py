"""Sequence parallelism is searched only where tp divides every sequence it shards. An
encoder-decoder has two sequences (tests/odd_models/two_sequences.py: 8 source and 7 target
tokens); the planner once read only the first input's length, offered SP at tp=2, and the run
sharded the 7-token decoder 4 + 3, which came back 8 positions long."""

from __future__ import annotations

from pathlib import Path

import pytest

from autoplan.cli import main
from autoplan.errors import PlanError
from autoplan.solve import sequence_parallel
from autoplan.solve.api import plan_graph
from autoplan.trace import trace_model_file

MODEL = Path(__file__).resolve().parents[2] / "odd_models" / "two_sequences.py"


@pytest.fixture(scope="module")
def graph():
    return trace_model_file(MODEL, 8)


def test_every_sequence_of_an_encoder_decoder_is_found(graph):
    assert graph.seq_len == 8  # the first integer input's length: all the planner read before
    assert sequence_parallel.sequence_lengths(graph) == (7, 8)


def test_sp_is_not_searched_where_tp_leaves_a_sequence_uneven(graph):
    result = plan_graph(graph, devices=2, profile="cpu-gloo", fix="tp=2")
    assert result.candidates and not any(c.config["sp"] for c in result.candidates)
    assert result.best.tp == 2 and not result.best.sequence_parallel
    even = sequence_parallel.sp_options(tp=2, seq_lens=(8, 16), fixes={})
    assert even == [False, True]  # every sequence divides: offered


def test_a_pin_of_sp_that_leaves_a_sequence_uneven_is_one_sentence(graph, tmp_path, capsys):
    with pytest.raises(PlanError, match="sequence of length 7"):
        plan_graph(graph, devices=2, profile="cpu-gloo", fix="tp=2,sp=on")
    args = ["--devices", "2", "--profile", "cpu-gloo", "--batch", "8", "--fix", "tp=2,sp=on", "--quiet"]
    assert main(["plan", str(MODEL), *args, "--out", str(tmp_path / "plan")]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if not line.startswith("autoplan: warning:")]
    assert len(errors) == 1 and "which 2 does not divide" in errors[0] and errors[0].endswith("."), errors
