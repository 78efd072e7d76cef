"""A temporal convolution net with the legacy hook-based ``torch.nn.utils.weight_norm`` (TCN, WaveNet and HiFi-GAN
code): the module keeps ``weight`` as a tensor computed from ``weight_g`` and ``weight_v``, which deepcopy refuses."""

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.utils import weight_norm


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = weight_norm(nn.Conv1d(16, 16, 3, padding=1))

    def forward(self, x):
        return x + torch.relu(self.conv(x))


class M(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(Block() for _ in range(2))
        self.head = nn.Conv1d(16, 1, 1)

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return self.head(x).squeeze(1)


def build_model():
    return M()


def example_inputs(n):
    return (torch.randn(n, 16, 12),)


def example_target(n):
    return torch.randn(n, 12)


def loss_fn(o, t):
    return F.mse_loss(o, t)
