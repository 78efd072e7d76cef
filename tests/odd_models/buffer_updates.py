"""Buffers a forward updates and reads: a spectral norm's power-iteration vector (torch.nn.utils.spectral_norm) and
a running mean the model subtracts. Each data-parallel rank updates its own copy over its own micro-batches."""

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.utils import spectral_norm

D = 12


class RunningCenter(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("mean", torch.zeros(D), persistent=False)

    def forward(self, x):
        if self.training:
            with torch.no_grad():
                self.mean.mul_(0.5).add_(0.5 * x.mean(0))
        return x - self.mean


class BufferUpdates(nn.Module):
    def __init__(self):
        super().__init__()
        self.center = RunningCenter()
        self.blocks = nn.ModuleList(nn.Sequential(spectral_norm(nn.Linear(D, D)), nn.Tanh()) for _ in range(2))
        self.head = nn.Linear(D, 2)

    def forward(self, x):
        x = self.center(x)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def build_model():
    return BufferUpdates()


def example_inputs(batch_size):
    return (torch.randn(batch_size, D) + 2.0,)


def example_target(batch_size):
    return torch.randn(batch_size, 2)


def loss_fn(output, target):
    return F.mse_loss(output, target)
