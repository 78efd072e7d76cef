"""Blocks of different shapes: a funnel of residual blocks whose width halves at each stage,
joined by projections, so no two consecutive blocks are identical."""

import torch
import torch.nn as nn


class Block(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.norm, self.up, self.down = nn.LayerNorm(width), nn.Linear(width, 2 * width), nn.Linear(2 * width, width)

    def forward(self, x):
        return x + self.down(nn.functional.gelu(self.up(self.norm(x))))


class Funnel(nn.Module):
    def __init__(self, widths=(128, 128, 64, 64, 32, 32)):
        super().__init__()
        self.stem = nn.Linear(48, widths[0])
        layers = []
        for i, width in enumerate(widths):
            if i and widths[i - 1] != width:
                layers.append(nn.Linear(widths[i - 1], width))
            layers.append(Block(width))
        self.body = nn.Sequential(*layers)
        self.head = nn.Linear(widths[-1], 4)

    def forward(self, x):
        return self.head(self.body(self.stem(x)))


def build_model():
    return Funnel()


def example_inputs(batch_size):
    return (torch.randn(batch_size, 48),)
