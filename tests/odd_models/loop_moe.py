"""A Mixture-of-Experts transformer whose MoE layer loops over its experts, as transformers 4.x wrote
Mixtral and Qwen2-MoE and as most research code still does: a router ``nn.Linear`` (``gate``), a
softmax and ``topk``, then for each expert ``torch.where`` on its slice of the one-hot mask, the
expert on those tokens, and ``index_add_`` back, skipping an expert that got no token. The experts
are an ``nn.ModuleList`` of alike SwiGLU MLPs. The block returns ``(hidden, router_logits)`` as
Mixtral's did. Sizes overridable with AUTOPLAN_LOOP_MOE_<NAME> for LAYERS, DIM, HEADS, FFN,
EXPERTS, TOP_K, VOCAB, SEQ; Mixtral 8x7B is LAYERS=32 DIM=4096 HEADS=32 FFN=14336 EXPERTS=8
TOP_K=2 VOCAB=32000 SEQ=4096."""

import os

import torch
import torch.nn as nn
import torch.nn.functional as F


def _size(name, default):
    return int(os.environ.get(f"AUTOPLAN_LOOP_MOE_{name}", default))


LAYERS, DIM, HEADS, FFN = _size("LAYERS", 2), _size("DIM", 32), _size("HEADS", 4), _size("FFN", 64)
EXPERTS, TOP_K, VOCAB, SEQ = _size("EXPERTS", 4), _size("TOP_K", 2), _size("VOCAB", 128), _size("SEQ", 16)


class ExpertMLP(nn.Module):
    """One expert: a SwiGLU FFN (Mixtral's ``w1``, ``w3`` gate/up and ``w2`` down)."""

    def __init__(self):
        super().__init__()
        self.w1 = nn.Linear(DIM, FFN, bias=False)
        self.w2 = nn.Linear(FFN, DIM, bias=False)
        self.w3 = nn.Linear(DIM, FFN, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class SparseMoeBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.num_experts, self.top_k = EXPERTS, TOP_K
        self.gate = nn.Linear(DIM, EXPERTS, bias=False)
        self.experts = nn.ModuleList([ExpertMLP() for _ in range(EXPERTS)])

    def forward(self, hidden_states):
        batch, seq, dim = hidden_states.shape
        hidden_states = hidden_states.view(-1, dim)
        router_logits = self.gate(hidden_states)
        routing_weights = F.softmax(router_logits, dim=1, dtype=torch.float)
        routing_weights, selected_experts = torch.topk(routing_weights, self.top_k, dim=-1)
        routing_weights /= routing_weights.sum(dim=-1, keepdim=True)
        routing_weights = routing_weights.to(hidden_states.dtype)
        final = torch.zeros((batch * seq, dim), dtype=hidden_states.dtype, device=hidden_states.device)
        expert_mask = F.one_hot(selected_experts, num_classes=self.num_experts).permute(2, 1, 0)
        for expert_idx in range(self.num_experts):
            idx, top_x = torch.where(expert_mask[expert_idx])
            if top_x.numel() == 0:
                continue
            current = hidden_states[None, top_x].reshape(-1, dim)
            current = self.experts[expert_idx](current) * routing_weights[top_x, idx, None]
            final.index_add_(0, top_x, current.to(hidden_states.dtype))
        return final.reshape(batch, seq, dim), router_logits


class Layer(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(DIM), nn.LayerNorm(DIM)
        self.qkv, self.proj = nn.Linear(DIM, 3 * DIM), nn.Linear(DIM, DIM)
        self.moe = SparseMoeBlock()

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(C, dim=-1)
        q, k, v = (t.view(B, T, HEADS, C // HEADS).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, C)
        x = x + self.proj(y)
        moe_out, _ = self.moe(self.norm2(x))
        return x + moe_out


class LoopMoE(nn.Module):
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
    return LoopMoE()


def example_inputs(batch_size):
    return (torch.randint(0, VOCAB, (batch_size, SEQ)),)


def example_target(batch_size):
    return torch.randint(0, VOCAB, (batch_size, SEQ))


def loss_fn(output, target):
    return F.cross_entropy(output.view(-1, output.size(-1)), target.view(-1))
