"""Two towers whose outputs are scored pair by pair under a learned temperature held as a 0-dim parameter, as
CLIP's ``logit_scale = nn.Parameter(torch.tensor(2.6592))``: FSDP2's fully_shard refuses a scalar parameter."""

import torch
import torch.nn as nn
import torch.nn.functional as F

DIM, VOCAB, SEQ = 32, 100, 8


class Tower(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj, self.out = nn.Linear(DIM, DIM), nn.Linear(DIM, DIM)

    def forward(self, x):
        return self.out(torch.tanh(self.proj(x)))


class TwoTowers(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.text, self.image = Tower(), Tower()
        self.logit_scale = nn.Parameter(torch.tensor(2.6592))

    def forward(self, ids, pixels):
        text = F.normalize(self.text(self.embed(ids).mean(1)), dim=-1)
        image = F.normalize(self.image(pixels), dim=-1)
        return self.logit_scale.exp() * (text * image).sum(-1)


def build_model():
    return TwoTowers()


def example_inputs(batch_size):
    return (torch.randint(0, VOCAB, (batch_size, SEQ)), torch.randn(batch_size, DIM))


def example_target(batch_size):
    return torch.rand(batch_size)


def loss_fn(scores, target):
    return F.mse_loss(scores, target)
