"""One block module called three times (weights shared across depth, as in ALBERT or a
universal transformer), between two projections."""

import torch
import torch.nn as nn


class Shared(nn.Module):
    def __init__(self, width=64, repeats=3):
        super().__init__()
        self.inp = nn.Linear(24, width)
        self.shared = nn.Sequential(
            nn.LayerNorm(width), nn.Linear(width, 2 * width), nn.GELU(), nn.Linear(2 * width, width)
        )
        self.repeats = repeats
        self.out = nn.Linear(width, 6)

    def forward(self, x):
        h = self.inp(x)
        for _ in range(self.repeats):
            h = h + self.shared(h)
        return self.out(h)


def build_model():
    return Shared()


def example_inputs(batch_size):
    return (torch.randn(batch_size, 24),)
