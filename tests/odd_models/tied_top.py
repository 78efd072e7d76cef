"""Two top-level modules and no repeated block, the second's decoder tied to the first's embedding (a masked-LM head,
as one-layer Hugging Face SqueezeBERT and FNet are traced): the blocks are the two modules, and FSDP2 cannot shard
them as two units that share the tied weight; both are left to the root's unit (execute/data_parallel.py ``_apart``)."""

import torch
import torch.nn as nn
import torch.nn.functional as F

V, D, S = 100, 32, 8


class Body(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb, self.ff = nn.Embedding(V, D), nn.Linear(D, D)

    def forward(self, ids):
        return torch.relu(self.ff(self.emb(ids)))


class Head(nn.Module):
    def __init__(self):
        super().__init__()
        self.dense, self.decoder = nn.Linear(D, D), nn.Linear(D, V)

    def forward(self, h):
        return self.decoder(torch.tanh(self.dense(h)))


class TiedTop(nn.Module):
    def __init__(self):
        super().__init__()
        self.body, self.cls = Body(), Head()
        self.cls.decoder.weight = self.body.emb.weight

    def forward(self, ids):
        return self.cls(self.body(ids))


def build_model():
    return TiedTop()


def example_inputs(batch_size):
    return (torch.randint(0, V, (batch_size, S)),)


def example_target(batch_size):
    return torch.randint(0, V, (batch_size, S))


def loss_fn(output, target):
    return F.cross_entropy(output.reshape(-1, V), target.reshape(-1))
