"""`autoplan plan --fix offload_activations=on` and `autoplan explain` through the command line: the pin reaches
plan.json, a pin no plan can take is one sentence with exit 2, and explain says in one sentence
why the plan offloads its activations and what the next option costs (docs/cost-model.md, "Activation offload")."""

import json
from pathlib import Path

import pytest

from autoplan.cli import main
from autoplan.types.plan import Plan

GPT = str(Path(__file__).resolve().parents[3] / "examples" / "gpt.py")
SIZES = (("N_LAYER", "2"), ("N_EMBD", "128"), ("N_HEAD", "4"), ("VOCAB_SIZE", "1024"), ("BLOCK_SIZE", "64"))


@pytest.fixture
def small_gpt(monkeypatch):
    for field, value in SIZES:
        monkeypatch.setenv(f"AUTOPLAN_GPT_{field}", value)
    return GPT


def _plan(model, out, fix):
    return main(["--quiet", "plan", model, "--devices", "2", "--profile", "cpu-gloo", "--batch", "8", "--out", str(out),
                 "--fix", fix])  # fmt: skip


def test_the_pin_reaches_the_plan_and_explain_says_why(small_gpt, tmp_path, capsys):
    assert _plan(small_gpt, tmp_path, "offload_activations=on,recompute=none,offload=none") == 0
    plan = Plan.load(tmp_path / "plan.json")
    assert plan.offload_activations and plan.predicted.breakdown["compute_s"] > 0
    capsys.readouterr()
    assert main(["explain", str(tmp_path), "--json"]) == 0
    said = json.loads(capsys.readouterr().out)["activation_offload"]
    assert said.startswith("offload_activations keeps ") and "per step copying them out and back" in said
    assert "the best plan without it, " in said and said.endswith(" GiB.")


def test_a_pin_no_plan_can_take_is_one_sentence(small_gpt, tmp_path, capsys):
    assert _plan(small_gpt, tmp_path, "offload_activations=on,tp=2") == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("autoplan: error:")]
    assert len(errors) == 1 and "tp=2: activations are offloaded at tp = cp = ep = 1" in errors[0]
