"""A single residual block between an input and an output projection, in a ModuleList of one (a model configured
with one layer): one block, so pp <= 1; the tracer takes the top-level modules, the list among them, which FSDP2
cannot shard as a unit (no forward()), so its block is (execute/data_parallel.py ``_callable_units``)."""

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
        self.inp, self.blocks, self.out = nn.Linear(32, 64), nn.ModuleList([Block(64)]), nn.Linear(64, 8)

    def forward(self, x):
        x = self.inp(x)
        for block in self.blocks:
            x = block(x)
        return self.out(x)


def build_model():
    return OneBlock()


def example_inputs(batch_size):
    return (torch.randn(batch_size, 32),)


def example_target(batch_size):
    return torch.randint(0, 8, (batch_size,))


def loss_fn(output, target):
    return nn.functional.cross_entropy(output, target)
