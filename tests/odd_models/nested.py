"""Blocks inside nested containers: a ModuleDict of ModuleLists of Sequentials, walked in a
Python loop in forward."""

import torch
import torch.nn as nn


def block(width):
    return nn.Sequential(nn.LayerNorm(width), nn.Linear(width, width), nn.SiLU(), nn.Linear(width, width))


class Nested(nn.Module):
    def __init__(self, width=64):
        super().__init__()
        self.embed = nn.Linear(16, width)
        self.groups = nn.ModuleDict(
            {
                "low": nn.ModuleList([block(width) for _ in range(2)]),
                "high": nn.ModuleList([block(width) for _ in range(2)]),
            }
        )
        self.head = nn.Linear(width, 16)

    def forward(self, x):
        h = self.embed(x)
        for name in ("low", "high"):
            for layer in self.groups[name]:
                h = h + layer(h)
        return self.head(h)


def build_model():
    return Nested()


def example_inputs(batch_size):
    return (torch.randn(batch_size, 16),)
