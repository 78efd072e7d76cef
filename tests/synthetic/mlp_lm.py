"""A traced language model of pre-norm MLP blocks (embedding, two blocks, head): the smallest model whose TP
messages move both the fp32 residual stream and bf16 linear outputs under autocast (Megatron splits each block's
up projection colwise and its down projection rowwise)."""

import torch
import torch.nn as nn
import torch.nn.functional as F

from autoplan.trace import trace


class Block(nn.Module):
    """x + down(gelu(up(norm(x)))), up 4x wide."""

    def __init__(self, dim: int):
        super().__init__()
        self.norm, self.up, self.down = nn.RMSNorm(dim), nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

    def forward(self, x):
        return x + self.down(F.gelu(self.up(self.norm(x))))


class MlpLM(nn.Module):
    def __init__(self, dim: int, vocab: int):
        super().__init__()
        self.embed, self.blocks, self.head = (
            nn.Embedding(vocab, dim),
            nn.ModuleList([Block(dim), Block(dim)]),
            nn.Linear(dim, vocab),
        )

    def forward(self, tokens):
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def traced_mlp_lm(*, batch: int, seq: int, dim: int, vocab: int):
    """The traced MlpLM on [batch, seq] tokens with a cross-entropy loss (a fresh model and graph each call)."""
    tokens = torch.randint(0, vocab, (batch, seq))
    return trace(
        MlpLM(dim, vocab),
        (tokens,),
        loss_fn=lambda out, t: F.cross_entropy(out.flatten(0, 1), t.flatten()),
        target=tokens,
    )
