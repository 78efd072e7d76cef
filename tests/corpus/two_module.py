"""The textbook pipeline-parallel example: two unlike top-level modules and no repeated blocks,
split between them (torch.distributed.pipelining's split point)."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.part1 = nn.Linear(1000, 10)
        self.part2 = nn.Linear(10, 10)

    def forward(self, x):
        return self.part2(torch.relu(self.part1(x)))


def build_model():
    return Model()


def example_inputs(batch_size):
    return (torch.randn(batch_size, 1000),)


def example_target(batch_size):
    return torch.randint(0, 10, (batch_size,))


def loss_fn(output, target):
    return nn.functional.cross_entropy(output, target)
