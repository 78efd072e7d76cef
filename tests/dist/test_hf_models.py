"""The Hugging Face examples run pipeline plans for real on gloo and match the single-process
reference: their forward returns a ``ModelOutput``, which the pipeline's last stage must hand to
the loss as the model returns it, and their blocks take masks, position ids and rotary tables
made before the first block. T5 at its default dropout is run in tests/dist/test_corpus_run.py
(test_t5_at_its_default_dropout_verifies_with_dropout_off_and_says_so)."""

from __future__ import annotations

from pathlib import Path

import pytest
from exec_harness import run_verified

from autoplan.solve.api import plan_graph
from autoplan.trace import trace_model_file

pytest.importorskip("transformers")
pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name, fix", [("hf_llama", "pp=2,schedule=1f1b"), ("hf_gpt2", "pp=2,schedule=1f1b")])
def test_hf_example_runs_a_pipeline_plan_and_verifies(tmp_path, name, fix):
    model_file = ROOT / "examples" / f"{name}.py"
    plan = plan_graph(trace_model_file(model_file, 8), devices=2, profile="cpu-gloo", fix=fix).best
    path = plan.save(tmp_path / "plan.json")
    run_verified(model_file, path, tmp_path / "run", timeout=300)
