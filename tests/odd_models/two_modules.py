"""Two Linear attributes and a relu: no repeated block; a pipeline cuts between the two modules."""

import torch
import torch.nn as nn
import torch.nn.functional as F


class TwoLinear(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(64, 128), nn.Linear(128, 10)

    def forward(self, x):
        return self.b(F.relu(self.a(x)))


def build_model():
    return TwoLinear()


def example_inputs(batch_size):
    return (torch.randn(batch_size, 64),)
