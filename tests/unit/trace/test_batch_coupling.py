"""An output that couples the samples of a batch (autoplan/trace/batch_coupling.py): CLIP's in-batch contrastive
logits ``[B, B]`` are recorded, a ``[B, C]`` classifier whose C happens to equal B is not, and the planner keeps the
batch of a coupled model whole (no dp, one micro-batch), refusing a pin that splits it in one sentence."""

from __future__ import annotations

import pytest

from autoplan.errors import PlanError
from autoplan.solve.api import plan_graph
from autoplan.trace.api import trace_model_file

TOWERS = """
import torch, torch.nn as nn, torch.nn.functional as F
class TwoTowers(nn.Module):
    def __init__(self):
        super().__init__()
        self.text, self.image = nn.Linear(16, 16), nn.Linear(16, 16)
    def forward(self, a, b):
        return F.normalize(self.text(a), dim=-1) @ F.normalize(self.image(b), dim=-1).t()
def build_model(): return TwoTowers()
def example_inputs(n): return (torch.randn(n, 16), torch.randn(n, 16))
def example_target(n): return torch.arange(n)
def loss_fn(logits, target): return F.cross_entropy(logits, torch.arange(logits.size(0), device=logits.device))
"""
POOLED = """
import torch, torch.nn as nn, torch.nn.functional as F
class Pooled(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj, self.pool = nn.Linear(16, 16), nn.Linear(16, 16)
    def forward(self, x):
        h = self.proj(x)
        return h, self.pool(h[:, 0])
def build_model(): return Pooled()
def example_inputs(n): return (torch.randn(n, 8, 16),)
def example_target(n): return torch.randn(n, 8, 16)
def loss_fn(out, target): return F.mse_loss(out[0], target)
"""
SIGLIP = """
import torch, torch.nn.functional as F
from transformers import SiglipConfig, SiglipModel
def build_model():
    text = dict(vocab_size=100, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
                max_position_embeddings=8)
    vision = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64, image_size=16,
                  patch_size=8)
    return SiglipModel(SiglipConfig(text_config=text, vision_config=vision, attn_implementation="sdpa"))
def example_inputs(n): return (torch.randint(0, 100, (n, 8)), torch.randn(n, 3, 16, 16))
def loss_fn(out, target=None):
    logits = out["logits_per_text"]
    return -F.logsigmoid((2 * torch.eye(logits.size(0), device=logits.device) - 1) * logits).sum() / logits.size(0)
"""
CLASSES = """
import torch, torch.nn as nn, torch.nn.functional as F
def build_model(): return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8))
def example_inputs(n): return (torch.randn(n, 16),)
def example_target(n): return torch.zeros(n, dtype=torch.long)
def loss_fn(logits, target): return F.cross_entropy(logits, target)
"""


def _traced(tmp_path, name, text):
    path = tmp_path / f"{name}.py"
    path.write_text(text)
    return trace_model_file(path, 8)


def test_a_contrastive_output_is_recorded_and_a_classifier_with_as_many_classes_as_samples_is_not(tmp_path):
    assert _traced(tmp_path, "towers", TOWERS).batch_coupled == [8, 8]
    assert _traced(tmp_path, "classes", CLASSES).batch_coupled == []  # [8, 8] at batch 8, [16, 8] at 16
    # [8, 8, 16] at batch 8 (two dims of its size) is [16, 8, 16] at 16: two dims of 16, one of them grown
    assert _traced(tmp_path, "pooled", POOLED).batch_coupled == []


def test_a_contrastive_output_of_a_model_returning_nested_outputs_is_recorded(tmp_path):
    """HF SigLIP returns 8 tensors (each tower's own output nested in its ModelOutput) where the graph's output node
    holds 4, and the outputs at twice the batch were compared with the graph's: SigLIP and CLIP were planned with
    their batch split, another loss than the model's, and --verify passed (its reference splits alike)."""
    pytest.importorskip("transformers")
    assert _traced(tmp_path, "siglip", SIGLIP).batch_coupled == [8, 8]


def test_the_planner_keeps_a_coupled_batch_whole_and_refuses_a_pin_that_splits_it(tmp_path):
    """Split over dp or micro-batches, each part scored against its own samples: another loss (3.08 against the
    model's 3.35 on the first step), which --verify's reference, splitting alike, passed."""
    graph = _traced(tmp_path, "towers", TOWERS)
    result = plan_graph(graph, devices=2, profile="cpu-gloo")
    assert result.candidates and all(c.config["dp"] == 1 for c in result.candidates)
    assert result.best.num_microbatches == 1 and result.best.micro_batch_size == 8
    for pin in ("dp=2", "mbs=4"):
        with pytest.raises(PlanError) as refused:
            plan_graph(graph, devices=2, profile="cpu-gloo", fix=pin)
        said = str(refused.value)
        assert f"--fix {pin}" in said and "couples the samples of a batch" in said and "\n" not in said
    assert any(c.config["dp"] == 2 for c in plan_graph(_traced(tmp_path, "classes", CLASSES), devices=2,
                                                       profile="cpu-gloo").candidates)  # fmt: skip
