"""A mixture-of-experts transformer: attention + a top-2 MoE MLP in every layer.

Routing is GShard/Switch-style with a fixed expert capacity, written with dense one-hot
dispatch and combine tensors (einsum), so every shape is static and the model traces on fake
tensors: each expert processes exactly ``capacity`` token slots. Sizes overridable with
AUTOPLAN_MOE_<NAME> for LAYERS, DIM, HEADS, EXPERTS, TOP_K, VOCAB, SEQ."""

import math
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

LAYERS = int(os.environ.get("AUTOPLAN_MOE_LAYERS", 2))
DIM = int(os.environ.get("AUTOPLAN_MOE_DIM", 256))
HEADS = int(os.environ.get("AUTOPLAN_MOE_HEADS", 4))
EXPERTS = int(os.environ.get("AUTOPLAN_MOE_EXPERTS", 4))
TOP_K = int(os.environ.get("AUTOPLAN_MOE_TOP_K", 2))
VOCAB = int(os.environ.get("AUTOPLAN_MOE_VOCAB", 8000))
SEQ = int(os.environ.get("AUTOPLAN_MOE_SEQ", 128))
CAPACITY_FACTOR = 1.25


class Expert(nn.Module):
    def __init__(self):
        super().__init__()
        self.w_in, self.w_out = nn.Linear(DIM, 4 * DIM), nn.Linear(4 * DIM, DIM)

    def forward(self, x):
        return self.w_out(F.gelu(self.w_in(x)))


class MoE(nn.Module):
    def __init__(self):
        super().__init__()
        self.router = nn.Linear(DIM, EXPERTS, bias=False)
        self.experts = nn.ModuleList([Expert() for _ in range(EXPERTS)])

    def forward(self, x):
        B, T, C = x.shape
        tokens = x.reshape(B * T, C)
        capacity = math.ceil(CAPACITY_FACTOR * B * T * TOP_K / EXPERTS)
        probs = F.softmax(self.router(tokens), dim=-1)
        weights, chosen = probs.topk(TOP_K, dim=-1)  # [S, k]
        onehot = F.one_hot(chosen, EXPERTS).to(x.dtype)  # [S, k, E]
        position = (torch.cumsum(onehot.reshape(-1, EXPERTS), dim=0).reshape(B * T, TOP_K, EXPERTS) - 1) * onehot
        keep = onehot * (position < capacity).to(x.dtype)  # drop overflow tokens
        slots = F.one_hot(position.long().clamp(0, capacity - 1), capacity).to(x.dtype) * keep.unsqueeze(-1)
        dispatch = slots.sum(1)  # [S, E, C]
        combine = (slots * weights.unsqueeze(-1).unsqueeze(-1)).sum(1)  # [S, E, C]
        expert_in = torch.einsum("sec,sd->ecd", dispatch, tokens)  # [E, C, D]
        expert_out = torch.stack([expert(expert_in[i]) for i, expert in enumerate(self.experts)])
        return torch.einsum("sec,ecd->sd", combine, expert_out).reshape(B, T, C)


class Layer(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(DIM), nn.LayerNorm(DIM)
        self.qkv, self.proj = nn.Linear(DIM, 3 * DIM), nn.Linear(DIM, DIM)
        self.moe = MoE()

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(C, dim=-1)
        q, k, v = (t.view(B, T, HEADS, C // HEADS).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, C)
        x = x + self.proj(y)
        return x + self.moe(self.norm2(x))


class MoETransformer(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.layers = nn.ModuleList([Layer() for _ in range(LAYERS)])
        self.norm, self.head = nn.LayerNorm(DIM), nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, tokens):
        x = self.embed(tokens)
        for layer in self.layers:
            x = layer(x)
        return self.head(self.norm(x))


def build_model():
    return MoETransformer()


def example_inputs(batch_size):
    return (torch.randint(0, VOCAB, (batch_size, SEQ)),)


def example_target(batch_size):
    return torch.randint(0, VOCAB, (batch_size, SEQ))


def loss_fn(output, target):
    return F.cross_entropy(output.view(-1, output.size(-1)), target.view(-1))
