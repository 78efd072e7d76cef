"""A trainable embedding read only under torch.no_grad() (a stem its author meant to keep fixed but did not freeze),
a trainable projection the forward never calls (as BART's ``shared`` embedding once the word embeddings are
untied, Dinov2's ``mask_token`` without a mask), and a pooler whose output the model returns and the loss never
reads (as Hugging Face BERT-style pooled outputs): none gets a gradient. ZeRO-1 reduces zeros for them and --verify
leaves them out; DDP, which waits for every trainable parameter's gradient, looks for unused ones (found before it
wraps the model: execute/unreached.py)."""

import torch
import torch.nn as nn
import torch.nn.functional as F

D, S, V = 16, 8, 32


class NoGradStem(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(V, D)
        self.blocks = nn.ModuleList(nn.Sequential(nn.LayerNorm(D), nn.Linear(D, D), nn.GELU()) for _ in range(2))
        self.head = nn.Linear(D, V)
        self.spare = nn.Linear(D, D)  # never called
        self.pool = nn.Linear(D, D)  # returned, never in the loss

    def forward(self, ids):
        with torch.no_grad():
            x = self.embed(ids)
        for block in self.blocks:
            x = x + block(x)
        return self.head(x), torch.tanh(self.pool(x[:, 0]))


def build_model():
    return NoGradStem()


def example_inputs(batch_size):
    return (torch.randint(0, V, (batch_size, S)),)


def example_target(batch_size):
    return torch.randint(0, V, (batch_size, S))


def loss_fn(output, target):
    logits, _pooled = output
    return F.cross_entropy(logits.reshape(-1, V), target.reshape(-1))
