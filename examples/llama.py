"""A Llama-style decoder: RMSNorm, SwiGLU MLP, rotary position embeddings and grouped-query
attention (8 query heads share 2 key/value heads). Sizes in CONFIG, overridable with
AUTOPLAN_LLAMA_<FIELD> (e.g. AUTOPLAN_LLAMA_N_LAYERS=32)."""

import os
from dataclasses import dataclass, fields

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class LlamaConfig:
    n_layers: int = 4
    dim: int = 512
    n_heads: int = 8
    n_kv_heads: int = 2
    ffn_dim: int = 1376
    vocab_size: int = 32000
    seq_len: int = 256
    rope_theta: float = 10000.0


CONFIG = LlamaConfig()
for _f in fields(CONFIG):
    if os.environ.get(f"AUTOPLAN_LLAMA_{_f.name.upper()}"):
        setattr(CONFIG, _f.name, type(getattr(CONFIG, _f.name))(os.environ[f"AUTOPLAN_LLAMA_{_f.name.upper()}"]))


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary(x, cos, sin):
    """Rotate ``x`` by the fp32 tables cast to its dtype first, as Hugging Face's Llama (``cos.to(x.dtype)``) and
    Meta's (``type_as``) do: under bf16 weights q and k stay bf16 instead of promoting to fp32."""
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    return x * cos + rotate_half(x) * sin


class Attention(nn.Module):
    def __init__(self, c: LlamaConfig):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = c.n_heads, c.n_kv_heads, c.dim // c.n_heads
        self.wq = nn.Linear(c.dim, c.n_heads * self.head_dim, bias=False)
        self.wk = nn.Linear(c.dim, c.n_kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(c.dim, c.n_kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(c.n_heads * self.head_dim, c.dim, bias=False)

    def forward(self, x, cos, sin):
        B, T, _ = x.shape
        q = self.wq(x).view(B, T, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.wk(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        repeat = self.n_heads // self.n_kv_heads
        k, v = k.repeat_interleave(repeat, dim=1), v.repeat_interleave(repeat, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(y.transpose(1, 2).reshape(B, T, -1))


class SwiGLU(nn.Module):
    def __init__(self, c: LlamaConfig):
        super().__init__()
        self.w1 = nn.Linear(c.dim, c.ffn_dim, bias=False)
        self.w3 = nn.Linear(c.dim, c.ffn_dim, bias=False)
        self.w2 = nn.Linear(c.ffn_dim, c.dim, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class DecoderLayer(nn.Module):
    def __init__(self, c: LlamaConfig):
        super().__init__()
        self.attention_norm, self.attention = nn.RMSNorm(c.dim), Attention(c)
        self.ffn_norm, self.feed_forward = nn.RMSNorm(c.dim), SwiGLU(c)

    def forward(self, x, cos, sin):
        x = x + self.attention(self.attention_norm(x), cos, sin)
        return x + self.feed_forward(self.ffn_norm(x))


class Llama(nn.Module):
    def __init__(self, c: LlamaConfig):
        super().__init__()
        self.tok_embeddings = nn.Embedding(c.vocab_size, c.dim)
        self.layers = nn.ModuleList([DecoderLayer(c) for _ in range(c.n_layers)])
        self.norm = nn.RMSNorm(c.dim)
        self.output = nn.Linear(c.dim, c.vocab_size, bias=False)
        head_dim = c.dim // c.n_heads
        inv_freq = 1.0 / (c.rope_theta ** (torch.arange(0, head_dim, 2).float() / head_dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, tokens):
        positions = torch.arange(tokens.shape[1], device=tokens.device).float()
        freqs = torch.outer(positions, self.inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos(), emb.sin()
        x = self.tok_embeddings(tokens)
        for layer in self.layers:
            x = layer(x, cos, sin)
        return self.output(self.norm(x))


def build_model():
    return Llama(CONFIG)


def example_inputs(batch_size):
    return (torch.randint(0, CONFIG.vocab_size, (batch_size, CONFIG.seq_len)),)


def example_target(batch_size):
    return torch.randint(0, CONFIG.vocab_size, (batch_size, CONFIG.seq_len))


def loss_fn(output, target):
    return F.cross_entropy(output.view(-1, output.size(-1)), target.view(-1))
