"""`autoplan run` end to end on 2 gloo ranks: a loss that turns non-finite stops every rank with
one sentence (issue 29 item 5), and a plan and a run print only autoplan's lines (item 8)."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from autoplan.types.plan import Plan

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
#: What torchao, torch's pytree and DTensor printed on every run before autoplan/quiet.py.
NOISE = ("Failed to load", "is an Enum subclass", "DTensor random operators", "LeafSpec", "Warning:", "Traceback")


def _autoplan(args: list[str], cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "autoplan.cli", *args], capture_output=True, text=True,
                          env=dict(os.environ), timeout=timeout, cwd=cwd)  # fmt: skip


NAN_HEAD = textwrap.dedent('''
    import torch


    class Head(torch.nn.Module):
        """AdamW (lr 1e-4, autoplan's) moves ``gate`` down 1e-4 a step (its gradient is always 1), so
        log(gate) turns NaN at step 3: a loss that goes non-finite mid-run, on the last stage only."""

        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(8, 1)
            self.gate = torch.nn.Parameter(torch.tensor(2.5e-4))

        def forward(self, x):
            return self.proj(x) + self.gate + 0 * torch.log(self.gate)


    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = torch.nn.ModuleList([torch.nn.Linear(8, 8) for _ in range(2)])
            self.head = Head()

        def forward(self, x):
            for block in self.blocks:
                x = torch.relu(block(x))
            return self.head(x)


    def build_model():
        return Net()


    def example_inputs(batch_size):
        return (torch.randn(batch_size, 8),)
''')


def test_a_loss_that_turns_nan_stops_every_rank_with_one_sentence(tmp_path):
    """pp=2: the first stage's rank never sees the loss and must stop at the same step (no hang)."""
    (tmp_path / "nan_head.py").write_text(NAN_HEAD)
    plan = Plan(devices=2, dp=1, tp=1, pp=2, micro_batch_size=2, num_microbatches=1, schedule="gpipe",
                stages=[["blocks.0"], ["blocks.1"]]).save(tmp_path / "plan.json")  # fmt: skip
    result = _autoplan(["run", "nan_head.py", "--plan", str(plan), "--steps", "8", "--out", "run"], tmp_path)
    assert result.returncode == 4, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(errors) == 1 and errors[0].startswith("autoplan: error: the loss of step 3"), errors
    assert "is nan" in errors[0] and "log" in errors[0]
    rows = list(csv.DictReader((tmp_path / "run/measured.csv").open()))
    assert [int(r["step"]) for r in rows] == [0, 1, 2, 3] and rows[-1]["loss"] == "nan"
    summary = json.loads((tmp_path / "run/summary.json").read_text())
    assert summary["nonfinite_loss"] == {"step": 3, "loss": "nan"} and summary["final_loss"] is None


def test_a_rank_that_refuses_its_plan_says_so_in_one_line_and_with_debug_its_traceback(tmp_path):
    """Stages listed out of the order forward() calls them: each rank raises PlanError at the split. The launcher
    names it in one line; the ranks' tracebacks, printed above it before, only with --debug."""
    (tmp_path / "nan_head.py").write_text(NAN_HEAD)
    plan = Plan(devices=2, dp=1, tp=1, pp=2, micro_batch_size=2, num_microbatches=1, schedule="gpipe",
                stages=[["blocks.1"], ["blocks.0"]]).save(tmp_path / "plan.json")  # fmt: skip
    args = ["run", "nan_head.py", "--plan", str(plan), "--steps", "2", "--out", "run"]
    refused = _autoplan(args, tmp_path)
    errors = [line for line in refused.stderr.splitlines() if line.strip()]
    assert refused.returncode == 2 and len(errors) == 1, refused.stderr[-3000:]
    assert errors[0].startswith("autoplan: error: ranks 0, 1 failed (exit code 1): PlanError: "), errors
    debugged = _autoplan(["--debug", *args[:-1], "run2"], tmp_path)
    assert debugged.returncode != 0 and debugged.stderr.count("autoplan.errors.PlanError: ") >= 2


BERT = textwrap.dedent("""
    import torch
    from transformers import BertConfig, BertForMaskedLM

    VOCAB, SEQ = 128, 16


    def build_model():
        config = BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                            intermediate_size=64, max_position_embeddings=SEQ)  # default dropout 0.1
        return BertForMaskedLM(config)


    def example_inputs(batch_size):
        return (torch.randint(0, VOCAB, (batch_size, SEQ)),)


    def loss_fn(output, target):
        return output.logits.float().pow(2).mean()
""")


def test_plan_and_run_print_only_autoplans_lines(tmp_path):
    """A Hugging Face model (transformers imports torchao) with dropout under tp=2 (DTensor random
    ops on a CPU mesh): every line on stderr is autoplan's, and none of the known noise appears."""
    (tmp_path / "bert.py").write_text(BERT)
    plan = _autoplan(
        [
            "plan",
            "bert.py",
            "--devices",
            "2",
            "--profile",
            "cpu-gloo",
            "--batch",
            "4",
            "--fix",
            "tp=2",
            "--out",
            "plan",
        ],
        tmp_path,
    )
    assert plan.returncode == 0, plan.stderr[-3000:]
    run = _autoplan(["run", "bert.py", "--plan", "plan", "--steps", "2", "--out", "run"], tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    for result in (plan, run):
        assert all(line.startswith("autoplan: ") for line in result.stderr.splitlines() if line.strip()), result.stderr
        assert not any(noise in result.stdout + result.stderr for noise in NOISE), result.stdout + result.stderr


LOUD_LOSS = textwrap.dedent("""
    import torch


    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = torch.nn.ModuleList([torch.nn.Linear(8, 8) for _ in range(2)])
            self.head = torch.nn.Linear(8, 1)

        def forward(self, x):
            for block in self.blocks:
                x = torch.relu(block(x))
            return self.head(x)


    def build_model():
        return Net()


    def example_inputs(batch_size):
        return (torch.randn(batch_size, 8),)


    def loss_fn(output, target):
        return output.float().mean() * 4  # times the initial loss scale 2**16, its fp16 gradients overflow
""")


def test_fp16_steps_the_loss_scaler_skips_do_not_stop_the_run(tmp_path):
    """The scaler skips the first steps (their scaled gradients overflow fp16); their losses are
    finite, so the pipelined run goes on to the end and verifies the first applied step."""
    (tmp_path / "loud.py").write_text(LOUD_LOSS)
    plan = Plan(devices=2, dp=1, tp=1, pp=2, micro_batch_size=1, num_microbatches=2, schedule="gpipe",
                precision="fp16", stages=[["blocks.0"], ["blocks.1"]]).save(tmp_path / "plan.json")  # fmt: skip
    result = _autoplan(["run", "loud.py", "--plan", str(plan), "--steps", "5", "--verify", "--out", "run"], tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((tmp_path / "run/summary.json").read_text())
    assert summary["verify"]["passed"] and summary["verify"]["skipped_steps"] >= 1 and "nonfinite_loss" not in summary
    losses = [float(r["loss"]) for r in csv.DictReader((tmp_path / "run/measured.csv").open())]
    assert len(losses) == 5 and all(abs(loss) < 100 for loss in losses)  # unscaled, finite
