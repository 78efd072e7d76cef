"""A mixture-of-experts language model whose MoE layer loops over its experts, as transformers 4.x
wrote Mixtral and Qwen-MoE and most research code still does: a router Linear, softmax and top-k,
then for each expert torch.where(mask[e]), the expert on those tokens, and index_add_."""

import torch
import torch.nn as nn
import torch.nn.functional as F

VOCAB, DIM, SEQ, EXPERTS, TOP_K, LAYERS = 128, 32, 8, 4, 2, 2


class Expert(nn.Module):
    def __init__(self):
        super().__init__()
        self.w1, self.w3 = nn.Linear(DIM, 2 * DIM, bias=False), nn.Linear(DIM, 2 * DIM, bias=False)
        self.w2 = nn.Linear(2 * DIM, DIM, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class SparseMoE(nn.Module):
    def __init__(self):
        super().__init__()
        self.gate = nn.Linear(DIM, EXPERTS, bias=False)
        self.experts = nn.ModuleList(Expert() for _ in range(EXPERTS))

    def forward(self, hidden):
        batch, seq, dim = hidden.shape
        tokens = hidden.view(-1, dim)
        weights, chosen = torch.topk(F.softmax(self.gate(tokens), dim=-1), TOP_K, dim=-1)
        weights = (weights / weights.sum(dim=-1, keepdim=True)).to(hidden.dtype)
        out = torch.zeros_like(tokens)
        mask = F.one_hot(chosen, num_classes=EXPERTS).permute(2, 1, 0)
        for e, expert in enumerate(self.experts):
            slot, token = torch.where(mask[e])
            if token.numel() == 0:
                continue
            out.index_add_(0, token, expert(tokens[token]) * weights[token, slot, None])
        return out.view(batch, seq, dim)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(DIM), nn.LayerNorm(DIM)
        self.attn = nn.MultiheadAttention(DIM, 4, batch_first=True)
        self.moe = SparseMoE()

    def forward(self, x):
        h = self.norm1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.moe(self.norm2(x))


class MoELM(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
        self.norm, self.head = nn.LayerNorm(DIM), nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, tokens):
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def build_model():
    return MoELM()


def example_inputs(batch_size):
    return (torch.randint(0, VOCAB, (batch_size, SEQ)),)


def example_target(batch_size):
    return torch.randint(0, VOCAB, (batch_size, SEQ))


def loss_fn(output, target):
    return F.cross_entropy(output.reshape(-1, VOCAB), target.reshape(-1))
