"""A translation model on torch's own ``nn.Transformer`` (2 encoder and 2 decoder layers, batch-first, dropout
0.1), a causal target mask passed with ``tgt_is_causal=True``: torch.fx kept the whole ``nn.Transformer`` as one
node, so the planner found no block in it."""

import torch
import torch.nn as nn
import torch.nn.functional as F

VOCAB, SEQ, DIM = 300, 16, 64


class Seq2Seq(nn.Module):
    def __init__(self):
        super().__init__()
        self.src_emb, self.tgt_emb = nn.Embedding(VOCAB, DIM), nn.Embedding(VOCAB, DIM)
        self.pos = nn.Parameter(torch.zeros(1, SEQ, DIM))
        self.transformer = nn.Transformer(DIM, 4, 2, 2, 128, dropout=0.1, batch_first=True)
        self.out = nn.Linear(DIM, VOCAB)

    def forward(self, src, tgt):
        mask = nn.Transformer.generate_square_subsequent_mask(tgt.size(1), device=tgt.device)
        memory_in, target_in = self.src_emb(src) + self.pos, self.tgt_emb(tgt) + self.pos
        return self.out(self.transformer(memory_in, target_in, tgt_mask=mask, tgt_is_causal=True))


def build_model():
    return Seq2Seq()


def example_inputs(batch_size):
    return (torch.randint(0, VOCAB, (batch_size, SEQ)), torch.randint(0, VOCAB, (batch_size, SEQ)))


def example_target(batch_size):
    return torch.randint(0, VOCAB, (batch_size, SEQ))


def loss_fn(out, target):
    return F.cross_entropy(out.reshape(-1, VOCAB), target.reshape(-1))
