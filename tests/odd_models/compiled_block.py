"""A block the model file compiles itself (``torch.compile`` in build_model, here with the aot_eager backend, which
needs no C++ compiler). Selective recomputation wrapped the compiled module, and its backward or its compilation
stopped ("Tensor cached during selective activation checkpoint has been mutated", "BackendCompilerFailed"); the
checkpoint now goes inside, where torch.compile traces it (execute/recompute.py ``_compiled_inside``)."""

import torch
import torch.nn as nn
import torch.nn.functional as F

D = 32


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm, self.up, self.down = nn.LayerNorm(D), nn.Linear(D, 2 * D), nn.Linear(2 * D, D)

    def forward(self, x):
        return x + self.down(torch.relu(self.up(self.norm(x))))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(Block() for _ in range(4))
        self.head = nn.Linear(D, 4)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.head(x.mean(1))


def build_model():
    model = Net()
    model.blocks[1] = torch.compile(model.blocks[1], backend="aot_eager")
    return model


def example_inputs(batch_size):
    return (torch.randn(batch_size, 8, D, generator=torch.Generator().manual_seed(0)),)


def example_target(batch_size):
    return torch.randint(0, 4, (batch_size,), generator=torch.Generator().manual_seed(1))


def loss_fn(output, target):
    return F.cross_entropy(output, target)
