"""Small models for the executor's distributed tests: a GPT block with one fused qkv Linear
(nanoGPT-style global-head reshapes) and a Llama-style block with GQA, RMSNorm and SwiGLU."""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

VOCAB, DIM, HEADS, KV_HEADS, SEQ, LAYERS = 64, 32, 4, 2, 8, 4


class FusedAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.c_attn = nn.Linear(DIM, 3 * DIM)
        self.c_proj = nn.Linear(DIM, DIM)

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, HEADS, C // HEADS).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


class GPTBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln_1, self.attn, self.ln_2 = nn.LayerNorm(DIM), FusedAttention(), nn.LayerNorm(DIM)
        self.c_fc, self.c_proj = nn.Linear(DIM, 4 * DIM), nn.Linear(4 * DIM, DIM)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.c_proj(F.gelu(self.c_fc(self.ln_2(x))))


class TinyGPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(VOCAB, DIM), nn.Embedding(SEQ, DIM)
        self.h = nn.ModuleList(GPTBlock() for _ in range(LAYERS))
        self.ln_f, self.lm_head = nn.LayerNorm(DIM), nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, idx):
        pos = torch.arange(idx.size(1), device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))


class GQAAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.head_dim = DIM // HEADS
        self.wq = nn.Linear(DIM, HEADS * self.head_dim, bias=False)
        self.wk = nn.Linear(DIM, KV_HEADS * self.head_dim, bias=False)
        self.wv = nn.Linear(DIM, KV_HEADS * self.head_dim, bias=False)
        self.wo = nn.Linear(HEADS * self.head_dim, DIM, bias=False)

    def forward(self, x, cos, sin):
        B, T, _ = x.shape
        q = self.wq(x).view(B, T, HEADS, self.head_dim)
        k = self.wk(x).view(B, T, KV_HEADS, self.head_dim)
        v = self.wv(x).view(B, T, KV_HEADS, self.head_dim)
        q, k = q * cos + _rotate(q) * sin, k * cos + _rotate(k) * sin
        k = k.repeat_interleave(HEADS // KV_HEADS, dim=2)
        v = v.repeat_interleave(HEADS // KV_HEADS, dim=2)
        y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        return self.wo(y.transpose(1, 2).reshape(B, T, -1))


def _rotate(x):
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


class LlamaBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.attention_norm, self.attention = nn.RMSNorm(DIM), GQAAttention()
        self.ffn_norm = nn.RMSNorm(DIM)
        self.w1, self.w3, self.w2 = nn.Linear(DIM, 2 * DIM, bias=False), nn.Linear(DIM, 2 * DIM, bias=False), nn.Linear(2 * DIM, DIM, bias=False)

    def forward(self, x, cos, sin):
        x = x + self.attention(self.attention_norm(x), cos, sin)
        h = self.ffn_norm(x)
        return x + self.w2(F.silu(self.w1(h)) * self.w3(h))


class TinyLlama(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok_embeddings = nn.Embedding(VOCAB, DIM)
        self.layers = nn.ModuleList(LlamaBlock() for _ in range(LAYERS))
        self.norm, self.output = nn.RMSNorm(DIM), nn.Linear(DIM, VOCAB, bias=False)
        freqs = torch.outer(torch.arange(SEQ).float(), 1.0 / 10000 ** (torch.arange(0, DIM // HEADS, 2).float() / (DIM // HEADS)))
        emb = torch.cat((freqs, freqs), dim=-1)[None, :, None, :]
        self.register_buffer("cos", emb.cos(), persistent=False)
        self.register_buffer("sin", emb.sin(), persistent=False)

    def forward(self, idx):
        x = self.tok_embeddings(idx)
        for layer in self.layers:
            x = layer(x, self.cos, self.sin)
        return self.output(self.norm(x))


def tokens(batch_size: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch_size, SEQ), generator=torch.Generator().manual_seed(seed))


def lm_loss(logits, target):
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), target.reshape(-1))


def gpt_tp_plan(sp: bool) -> dict[str, str]:
    plan = {"wte": "rowwise", "lm_head": "colwise"}
    for i in range(LAYERS):
        plan.update({f"h.{i}.attn.c_attn": "colwise", f"h.{i}.attn.c_proj": "rowwise",
                     f"h.{i}.c_fc": "colwise", f"h.{i}.c_proj": "rowwise"})
        if sp:
            plan.update({f"h.{i}.ln_1": "sequence_parallel", f"h.{i}.ln_2": "sequence_parallel"})
    return plan


def llama_tp_plan(sp: bool) -> dict[str, str]:
    plan = {"tok_embeddings": "rowwise", "output": "colwise"}
    for i in range(LAYERS):
        plan.update({f"layers.{i}.attention.{n}": "colwise" for n in ("wq", "wk", "wv")})
        plan.update({f"layers.{i}.w1": "colwise", f"layers.{i}.w3": "colwise",
                     f"layers.{i}.attention.wo": "rowwise", f"layers.{i}.w2": "rowwise"})
        if sp:
            plan.update({f"layers.{i}.attention_norm": "sequence_parallel", f"layers.{i}.ffn_norm": "sequence_parallel"})
    if sp:
        plan["norm"] = "sequence_parallel"
    return plan
