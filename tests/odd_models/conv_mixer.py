"""Hugging Face Mamba's shape at tensor parallelism: each block projects the stream, transposes it to channels first
and mixes it along the sequence with a depthwise ``conv1d`` (``F.conv1d`` on the module's weight), and the output
head is tied to the token embedding. tests/dist/test_odd_models_run.py pins the split that failed on Mamba: the
embedding colwise (its table ``Shard(1)``), ``proj`` rowwise under sequence parallelism, whose sequence-sharded
output DTensor convolved into a wrong shape (execute/dtensor_handlers.py, item 4), and the head replicated on the
tied, sharded table, which doubled every gradient (execute/tensor_parallel.py ``_whole_weights_while_called``)."""

import torch
import torch.nn as nn
import torch.nn.functional as F

V, D, S = 64, 32, 8


class Mixer(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(D)
        self.proj = nn.Linear(D, D)
        self.conv = nn.Conv1d(D, D, 4, groups=D, padding=3)
        self.out = nn.Linear(D, D)

    def forward(self, x):
        h = self.proj(self.norm(x)).transpose(1, 2)
        h = F.conv1d(h, self.conv.weight, self.conv.bias, padding=3, groups=D)[..., :S]
        return x + self.out(F.silu(h.transpose(1, 2)))


class ConvMixer(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(V, D)
        self.layers = nn.ModuleList(Mixer() for _ in range(2))
        self.head = nn.Linear(D, V, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, ids):
        x = self.embed(ids)
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


def build_model():
    return ConvMixer()


def example_inputs(batch_size):
    return (torch.randint(0, V, (batch_size, S)),)


def example_target(batch_size):
    return torch.randint(0, V, (batch_size, S))


def loss_fn(output, target):
    return F.cross_entropy(output.reshape(-1, V), target.reshape(-1))
