"""A loss whose op cannot run on fake tensors (CTC: aten._ctc_loss's output shape depends on the target lengths'
values) is traced as a node of no FLOPs, and the plan says so in one line, where the trace refused every model
trained with CTC (Hugging Face Wav2Vec2ForCTC) and blamed the user's loss_fn."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from autoplan.cli import main
from autoplan.trace import trace

T, C, L = 12, 8, 4

MODEL_FILE = f"""
import torch
import torch.nn.functional as F

T, C, L = {T}, {C}, {L}


def build_model():
    return torch.nn.Sequential(torch.nn.Linear(C, 16), torch.nn.ReLU(), torch.nn.Linear(16, C))


def example_inputs(batch_size):
    return (torch.randn(batch_size, T, C),)


def example_target(batch_size):
    return torch.randint(1, C, (batch_size, L))


def loss_fn(logits, target):
    log_probs = logits.log_softmax(-1).transpose(0, 1)
    lengths = torch.full((log_probs.shape[1],), T, dtype=torch.long)
    return F.ctc_loss(log_probs, target, lengths, torch.full_like(lengths, L))
"""


def _ctc(logits, target):
    log_probs = logits.log_softmax(-1).transpose(0, 1)
    lengths = torch.full((log_probs.shape[1],), T, dtype=torch.long)
    return F.ctc_loss(log_probs, target, lengths, torch.full_like(lengths, L))


def test_a_ctc_loss_traces_as_an_unmeasured_node():
    model = nn.Sequential(nn.Linear(C, 16), nn.ReLU(), nn.Linear(16, C))
    graph = trace(model, (torch.randn(4, T, C),), loss_fn=_ctc, target=torch.randint(1, C, (4, L)))
    (loss,) = [n for n in graph.nodes if n.op == "loss"]
    assert loss.attrs == {"unmeasured": "aten._ctc_loss.Tensor"} and loss.fwd_flops == loss.bwd_flops == 0
    assert sum(n.fwd_flops for n in graph.nodes) == 2 * 4 * T * (C * 16 + 16 * C)  # the model's, all measured


def test_plan_of_a_ctc_model_says_its_loss_is_not_priced(tmp_path, capsys):
    (tmp_path / "ctc.py").write_text(MODEL_FILE)
    args = ["plan", str(tmp_path / "ctc.py"), "--devices", "2", "--profile", "cpu-gloo", "--batch", "8"]
    assert main([*args, "--out", str(tmp_path / "plan"), "--quiet", "--no-trace-cache"]) == 0
    said = [line for line in capsys.readouterr().err.splitlines() if "_ctc_loss" in line]
    assert len(said) == 1 and "priced at zero" in said[0]
