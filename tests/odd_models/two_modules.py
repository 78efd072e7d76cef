"""Two Linear attributes and a relu: no repeated block; a pipeline cuts between the two modules. A third module's
output is discarded (a pooler a masked LM leaves unused): no block, so no pipeline boundary falls on it."""

import torch
import torch.nn as nn
import torch.nn.functional as F


class TwoLinear(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(64, 128), nn.Linear(128, 10)
        self.pool = nn.Linear(128, 16)

    def forward(self, x):
        h = F.relu(self.a(x))
        _pooled = torch.tanh(self.pool(h))  # computed, never used
        return self.b(h)


def build_model():
    return TwoLinear()


def example_inputs(batch_size):
    return (torch.randn(batch_size, 64),)
