"""Targets given as a dict, read by the loss: torch's pipeline schedule splits only a tensor target into micro-batches,
and every pipeline plan stopped at its first step ("'dict' object has no attribute 'size'"); the schedule now gets the
rows' indices and the loss their rows (execute/trainer.py ``_schedule_target``)."""

import torch
import torch.nn as nn
import torch.nn.functional as F

D = 32


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(D, D), nn.Tanh()) for _ in range(4))
        self.head = nn.Linear(D, 3)

    def forward(self, x):
        for block in self.blocks:
            x = x + block(x)
        return self.head(x)


def build_model():
    return Net()


def example_inputs(batch_size):
    return (torch.randn(batch_size, D, generator=torch.Generator().manual_seed(0)),)


def example_target(batch_size):
    g = torch.Generator().manual_seed(1)
    return {"label": torch.randint(0, 3, (batch_size,), generator=g), "weight": torch.rand(batch_size, generator=g)}


def loss_fn(output, target):
    return (F.cross_entropy(output, target["label"], reduction="none") * target["weight"]).mean()
