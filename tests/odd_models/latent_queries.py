"""A Perceiver-IO decoder: learned output queries (a top-level parameter expanded in the root forward) cross-attend
to the last block's output. The tracer takes the decoder's inner Linears for blocks, so a zero-bubble pipeline cuts
inside the decoder's forward, and a chunk sends on a tensor it also reads: torch's in-place detach after B left W a
detached saved tensor (execute/stage_outputs.py ``owned_outputs``)."""

import torch
import torch.nn as nn
import torch.nn.functional as F

D, T, V, QUERIES, HEADS = 32, 16, 64, 16, 4


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.q, self.kv, self.o = nn.Linear(D, D, bias=False), nn.Linear(D, 2 * D, bias=False), nn.Linear(D, D)

    def forward(self, x, context):
        b, n, m = x.shape[0], x.shape[1], context.shape[1]
        q = self.q(x).view(b, n, HEADS, -1).transpose(1, 2)
        k, v = (t.view(b, m, HEADS, -1).transpose(1, 2) for t in self.kv(context).chunk(2, dim=-1))
        return self.o(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, n, D))


class Layer(nn.Module):
    def __init__(self, cross: bool):
        super().__init__()
        self.cross, self.norm_q, self.norm_kv = cross, nn.LayerNorm(D), nn.LayerNorm(D) if cross else None
        self.attention, self.norm = Attention(), nn.LayerNorm(D)
        self.mlp = nn.Sequential(nn.Linear(D, 4 * D), nn.GELU(), nn.Linear(4 * D, D))

    def forward(self, x, context=None):
        q = self.norm_q(x)
        x = x + self.attention(q, self.norm_kv(context) if self.cross else q)
        return x + self.mlp(self.norm(x))


class LatentQueries(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(V, D)
        self.process = nn.ModuleList(Layer(False) for _ in range(3))
        self.queries = nn.Parameter(torch.randn(QUERIES, D) * 0.02)
        self.decode, self.head = Layer(True), nn.Linear(D, V)

    def forward(self, ids):
        z = self.embed(ids)
        for layer in self.process:
            z = layer(z)
        return self.head(self.decode(self.queries.unsqueeze(0).expand(ids.shape[0], -1, -1), z))


def build_model():
    return LatentQueries()


def example_inputs(batch_size):
    return (torch.randint(0, V, (batch_size, T), generator=torch.Generator().manual_seed(0)),)


def example_target(batch_size):
    return torch.randint(0, V, (batch_size, QUERIES), generator=torch.Generator().manual_seed(1))


def loss_fn(output, target):
    return F.cross_entropy(output.reshape(-1, V), target.reshape(-1))
