"""A single residual block between an input and an output projection: one block, so pp <= 1."""

import torch
import torch.nn as nn


class Block(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.norm, self.up, self.down = nn.LayerNorm(width), nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

    def forward(self, x):
        return x + self.down(torch.tanh(self.up(self.norm(x))))


class OneBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.inp, self.block, self.out = nn.Linear(32, 64), Block(64), nn.Linear(64, 8)

    def forward(self, x):
        return self.out(self.block(self.inp(x)))


def build_model():
    return OneBlock()


def example_inputs(batch_size):
    return (torch.randn(batch_size, 32),)


def example_target(batch_size):
    return torch.randint(0, 8, (batch_size,))


def loss_fn(output, target):
    return nn.functional.cross_entropy(output, target)
