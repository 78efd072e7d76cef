"""A mixture-of-experts transformer in plain torch: attention + a top-2 MoE MLP in every layer.

The MoE MLP routes dropless: a router Linear scores each token's experts, softmax, and each token
goes to its ``TOP_K`` best experts, weighted by their softmax probabilities as they are (not
renormalised over the top k, as Switch Transformer and Qwen2-MoE's default do). The experts
follow the Hugging Face experts interface (docs/moe.md), so autoplan traces them under its
routing model and can split them over ranks with expert parallelism (docs/executor.md):
``num_experts`` and 3-D weights ``up_proj [E, 4D, D]`` and ``down_proj [E, D, 4D]`` (a GELU FFN,
no gate: ``has_gate = False``; ``[out, in]`` per expert: ``is_transposed = False``), called as
``experts(hidden [S, D], top_k_index [S, k], top_k_weights [S, k])``. Its eager forward loops over
the experts that received tokens, with index ops, on per-expert views from one ``unbind`` of each
weight: its backward stacks the experts' gradients into one ``[E, ...]`` tensor, where indexing
``weight[e]`` per expert would make a zero-filled ``[E, ...]`` gradient per expert and sum them
(docs/cost-model.md, "The execution audit"). Sizes overridable with AUTOPLAN_MOE_<NAME> for LAYERS,
DIM, HEADS, EXPERTS, TOP_K, VOCAB, SEQ."""

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


class Experts(nn.Module):
    """``num_experts`` GELU FFNs stored as 3-D weights (the Hugging Face experts interface)."""

    has_gate, has_bias, is_transposed = False, False, False

    def __init__(self, num_experts: int = EXPERTS, dim: int = DIM, hidden: int = 4 * DIM):
        super().__init__()
        self.num_experts = num_experts
        self.up_proj = nn.Parameter(torch.empty(num_experts, hidden, dim))
        self.down_proj = nn.Parameter(torch.empty(num_experts, dim, hidden))
        self.act_fn = nn.GELU()
        self.reset_parameters()

    def reset_parameters(self):
        for weight in (self.up_proj, self.down_proj):  # each expert as nn.Linear initialises its weight
            bound = 1 / math.sqrt(weight.shape[-1])
            nn.init.uniform_(weight, -bound, bound)

    def forward(self, hidden_states, top_k_index, top_k_weights):
        out = torch.zeros_like(hidden_states)
        with torch.no_grad():
            hit = torch.unique(top_k_index)
        ups, downs = self.up_proj.unbind(0), self.down_proj.unbind(0)  # one gradient stack each (docstring)
        for expert in hit.tolist():
            token, choice = torch.where(top_k_index == expert)
            h = self.act_fn(F.linear(hidden_states[token], ups[expert]))
            h = F.linear(h, downs[expert]) * top_k_weights[token, choice, None]
            out.index_add_(0, token, h.to(out.dtype))
        return out


class MoE(nn.Module):
    def __init__(self):
        super().__init__()
        self.top_k = TOP_K
        self.router = nn.Linear(DIM, EXPERTS, bias=False)
        self.experts = Experts()

    def forward(self, x):
        B, T, C = x.shape
        tokens = x.reshape(B * T, C)
        probs = F.softmax(self.router(tokens), dim=-1)
        weights, chosen = probs.topk(self.top_k, dim=-1)  # [S, k]
        return self.experts(tokens, chosen, weights).reshape(B, T, C)


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
