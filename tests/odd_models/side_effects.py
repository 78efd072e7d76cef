"""A forward with Python side effects: it counts its calls on the module, appends to a list
and reads a flag, none of which is a tensor operation."""

import torch
import torch.nn as nn

SEEN = []


class Block(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.fc, self.norm = nn.Linear(width, width), nn.LayerNorm(width)

    def forward(self, x):
        return x + torch.relu(self.fc(self.norm(x)))


class SideEffects(nn.Module):
    def __init__(self, width=32, depth=4):
        super().__init__()
        self.inp, self.out = nn.Linear(20, width), nn.Linear(width, 5)
        self.layers = nn.ModuleList([Block(width) for _ in range(depth)])
        self.calls, self.debug = 0, False

    def forward(self, x):
        self.calls += 1
        SEEN.append(tuple(x.shape))
        if self.debug:
            print("forward", self.calls)
        h = self.inp(x)
        for layer in self.layers:
            h = layer(h)
        return self.out(h)


def build_model():
    return SideEffects()


def example_inputs(batch_size):
    return (torch.randn(batch_size, 20),)
