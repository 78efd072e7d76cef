"""Residual MLP blocks whose hidden activation is ``nn.ReLU(inplace=True)`` right after a Linear, as HF Swinv2's
position-bias MLP and many CNNs write it: selective recomputation keeps the Linear's output, which the ReLU would
overwrite."""

import torch
import torch.nn as nn
import torch.nn.functional as F

DIM = 32


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(DIM)
        self.mlp = nn.Sequential(nn.Linear(DIM, 4 * DIM), nn.ReLU(inplace=True), nn.Linear(4 * DIM, DIM))

    def forward(self, x):
        return x + self.mlp(self.norm(x))


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(Block() for _ in range(4))
        self.head = nn.Linear(DIM, 1)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.head(x).squeeze(-1)


def build_model():
    return Model()


def example_inputs(batch_size):
    return (torch.randn(batch_size, 6, DIM),)


def example_target(batch_size):
    return torch.randn(batch_size, 6)


def loss_fn(out, target):
    return F.mse_loss(out, target)
