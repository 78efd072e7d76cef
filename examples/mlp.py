"""A residual MLP on feature vectors: an input projection, DEPTH identical blocks
(LayerNorm -> Linear -> GELU -> Linear, residual), a classifier. Sizes overridable with
AUTOPLAN_MLP_DEPTH / _FEATURES / _HIDDEN / _CLASSES. No loss_fn: the default loss (a mean
of the output) is used."""

import os

import torch
import torch.nn as nn

DEPTH = int(os.environ.get("AUTOPLAN_MLP_DEPTH", 4))
FEATURES = int(os.environ.get("AUTOPLAN_MLP_FEATURES", 784))
HIDDEN = int(os.environ.get("AUTOPLAN_MLP_HIDDEN", 1024))
CLASSES = int(os.environ.get("AUTOPLAN_MLP_CLASSES", 10))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(HIDDEN)
        self.up, self.act, self.down = nn.Linear(HIDDEN, 4 * HIDDEN), nn.GELU(), nn.Linear(4 * HIDDEN, HIDDEN)

    def forward(self, x):
        return x + self.down(self.act(self.up(self.norm(x))))


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(FEATURES, HIDDEN)
        self.blocks = nn.Sequential(*[Block() for _ in range(DEPTH)])
        self.out = nn.Linear(HIDDEN, CLASSES)

    def forward(self, x):
        return self.out(self.blocks(self.inp(x)))


def build_model():
    return MLP()


def example_inputs(batch_size):
    return (torch.randn(batch_size, FEATURES),)
