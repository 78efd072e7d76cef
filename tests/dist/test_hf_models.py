"""The Hugging Face examples run pipeline and context-parallel plans for real on gloo and match the
single-process reference: their forward returns a ``ModelOutput``, which the pipeline's last stage must hand
to the loss as the model returns it, and their blocks take masks, position ids and rotary tables made before
the first block (a mask context parallelism applies row by row). T5 at its default dropout is run in
tests/dist/test_corpus_run.py (test_t5_at_its_default_dropout_verifies_with_dropout_off_and_says_so)."""

from __future__ import annotations

from pathlib import Path

import pytest
from exec_harness import run_verified

from autoplan.solve.api import plan_graph
from autoplan.trace import trace_model_file

pytest.importorskip("transformers")
pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    "name, fix",
    [
        ("hf_llama", "pp=2,schedule=1f1b"),
        ("hf_gpt2", "pp=2,schedule=1f1b"),
        # a chunk's encoder states, read by its decoder blocks and sent on: detached under them after B, W stopped
        ("../tests/corpus/hf_bart", "pp=2,schedule=zbv,recompute=full"),
    ],
)
def test_hf_example_runs_a_pipeline_plan_and_verifies(tmp_path, name, fix):
    model_file = (ROOT / "examples" / f"{name}.py").resolve()
    plan = plan_graph(trace_model_file(model_file, 8), devices=2, profile="cpu-gloo", fix=fix).best
    path = plan.save(tmp_path / "plan.json")
    run_verified(model_file, path, tmp_path / "run", timeout=300)


@pytest.mark.parametrize(
    "model_file, variant",
    [
        (ROOT / "examples" / "hf_llama.py", "allgather"),  # a traced causal mask; is_causal in eager
        (ROOT / "tests" / "corpus" / "hf_mistral_window.py", "ulysses"),  # a sliding-window mask in eager too
    ],
)
def test_hf_models_handing_sdpa_a_mask_made_before_the_blocks_run_context_parallel_plans(tmp_path, model_file, variant):
    """Hugging Face models trace their attention mask as a [B, 1, S, S] tensor made before the first block, which
    context parallelism once refused for every such model; each rank now applies its queries' rows of it."""
    graph = trace_model_file(model_file, 4)
    plan = plan_graph(graph, devices=2, profile="cpu-gloo", fix=f"cp=2,cp_variant={variant}").best
    assert plan.cp == 2 and plan.cp_variant == variant
    run_verified(model_file, plan.save(tmp_path / "plan.json"), tmp_path / "run", timeout=300)
