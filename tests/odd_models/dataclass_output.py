"""A forward that returns a plain ``@dataclass`` (logits and an auxiliary loss), with a branch torch.fx cannot take:
torch.export, which the trace falls back to and the pipeline split uses, flattens the output with pytree, which knew
no such class, so the model could not be planned, nor a pipeline plan run (trace/dataclass_outputs.py)."""

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

D, V, S = 32, 64, 8


@dataclass
class Output:
    logits: torch.Tensor
    aux_loss: torch.Tensor


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed, self.head = nn.Embedding(V, D), nn.Linear(D, V)
        self.blocks = nn.ModuleList(nn.Sequential(nn.LayerNorm(D), nn.Linear(D, D), nn.GELU()) for _ in range(4))

    def forward(self, ids):
        x = self.embed(ids)
        if x.shape[1] > 1:  # a branch torch.fx cannot take: torch.export traces
            for block in self.blocks:
                x = x + block(x)
        return Output(logits=self.head(x), aux_loss=x.pow(2).mean())


def build_model():
    return Net()


def example_inputs(batch_size):
    return (torch.randint(0, V, (batch_size, S), generator=torch.Generator().manual_seed(0)),)


def example_target(batch_size):
    return torch.randint(0, V, (batch_size, S), generator=torch.Generator().manual_seed(1))


def loss_fn(output, target):
    return F.cross_entropy(output.logits.reshape(-1, V), target.reshape(-1)) + 0.01 * output.aux_loss
