"""A causal LM whose targets skip tokens with -100 (padding at the end of each row, as a batch of short documents
pads; Hugging Face's labels do the same for prompts): the loss is the mean over the scored tokens only, so under
context parallelism the shards score unequal numbers of tokens."""

import torch
import torch.nn as nn
import torch.nn.functional as F

VOCAB, SEQ, DIM, HEADS = 100, 16, 32, 4


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm, self.qkv, self.out = nn.LayerNorm(DIM), nn.Linear(DIM, 3 * DIM), nn.Linear(DIM, DIM)

    def forward(self, x):
        b, s, _ = x.shape
        q, k, v = self.qkv(self.norm(x)).view(b, s, 3, HEADS, DIM // HEADS).permute(2, 0, 3, 1, 4).unbind(0)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return x + self.out(y.transpose(1, 2).reshape(b, s, DIM))


class LM(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed, self.pos = nn.Embedding(VOCAB, DIM), nn.Embedding(SEQ, DIM)
        self.blocks = nn.ModuleList(Block() for _ in range(2))
        self.head = nn.Linear(DIM, VOCAB)

    def forward(self, ids):
        x = self.embed(ids) + self.pos(torch.arange(ids.size(1), device=ids.device))
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def build_model():
    return LM()


def example_inputs(batch_size):
    return (torch.randint(0, VOCAB, (batch_size, SEQ), generator=torch.Generator().manual_seed(0)),)


def example_target(batch_size):
    target = torch.randint(0, VOCAB, (batch_size, SEQ), generator=torch.Generator().manual_seed(1))
    for row in range(batch_size):  # rows of 5 to 16 scored tokens, then padding
        target[row, 5 + (row * 7) % (SEQ - 4) :] = -100
    return target


def loss_fn(logits, target):
    return F.cross_entropy(logits.reshape(-1, VOCAB), target.reshape(-1), ignore_index=-100)
