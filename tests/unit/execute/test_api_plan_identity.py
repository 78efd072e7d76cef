"""The Python API's ``parallelize`` refuses a plan made for another model, as ``autoplan run`` does
(trace/identity.py): before, a ZeRO-3 plan of one model trained another silently."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

import autoplan
from autoplan.errors import PlanError


def _mlp(width: int) -> nn.Module:
    return nn.Sequential(nn.Linear(32, width), nn.ReLU(), nn.Linear(width, 4))


def test_parallelize_refuses_a_plan_made_for_another_model_before_it_builds_anything():
    plan = autoplan.plan(_mlp(64), (torch.randn(8, 32),), devices=1, profile="cpu-gloo", batch_size=8)
    assert plan.graph_signature
    with pytest.raises(PlanError, match="the plan was made for .* not for this Sequential .* other parameter names"):
        autoplan.parallelize(_mlp(48), plan, loss_fn=lambda out, target: out.mean())
