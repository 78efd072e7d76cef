"""Optional forward() arguments as users write them: ``mask=None`` passed as None and ``bias=None`` left at its default,
each behind ``if ... is not None:``. torch.fx made both placeholders and took both branches, and the trace stopped
feeding them None (trace/none_args.py)."""

import torch
import torch.nn as nn
import torch.nn.functional as F

D, V, S = 32, 64, 8


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm, self.mlp = nn.LayerNorm(D), nn.Sequential(nn.Linear(D, 2 * D), nn.GELU(), nn.Linear(2 * D, D))

    def forward(self, x, mask=None):
        h = self.mlp(self.norm(x))
        if mask is not None:
            h = h * mask[..., None]
        return x + h


class OptionalArgs(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed, self.blocks = nn.Embedding(V, D), nn.ModuleList(Block() for _ in range(4))
        self.head = nn.Linear(D, V)

    def forward(self, ids, mask=None, bias=None):
        x = self.embed(ids)
        if bias is not None:
            x = x + bias
        for block in self.blocks:
            x = block(x, mask)
        return self.head(x)


def build_model():
    return OptionalArgs()


def example_inputs(batch_size):
    return (torch.randint(0, V, (batch_size, S), generator=torch.Generator().manual_seed(0)), None)


def example_target(batch_size):
    return torch.randint(0, V, (batch_size, S), generator=torch.Generator().manual_seed(1))


def loss_fn(output, target):
    return F.cross_entropy(output.reshape(-1, V), target.reshape(-1))
