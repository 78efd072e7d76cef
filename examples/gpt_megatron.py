"""A GPT whose attention is computed the way Megatron-LM did in 2021-2022 (no flash attention).

Narayanan et al. SC'21 and Korthikanti et al. 2022 trained GPTs with Megatron-LM's
``ParallelTransformerLayer``; its attention materialises the b*a*s*s score matrix:

    mixed = query_key_value(x)                      # ONE fused linear h -> 3h, head-interleaved:
    mixed = mixed.view(b, s, a, 3*d)                 #   per head [q_i | k_i | v_i], so a column
    q, k, v = mixed.split(d, dim=-1)                 #   split by heads keeps whole heads per rank
    scores = (q / sqrt(d)) @ k^T                     # [b, a, s, s] in 16 bits (QK^T)
    probs = softmax(scores masked causally)          # Megatron: one fused scale+mask+softmax kernel
    probs = dropout(probs, p=attention_dropout)      # kept for the backward, with its 1-byte mask
    ctx = probs @ v                                  # [b, a, s, d]
    out = dense(ctx), dropout, + residual            # row-parallel linear

This is where Korthikanti et al. 2022 (section 4.1, eq. 1) get the 5*a*s/h term of the
activation memory per layer, sbh(34 + 5as/h): 2as^2 bytes of QK^T output (softmax input),
2as^2 of softmax output, as^2 of dropout mask, 2as^2 of dropout output. The MLP is
h -> 4h -> h with GELU, both blocks are pre-LayerNorm with dropout before each residual
add, the output head is tied to the word embedding, and the loss is cross entropy in fp32
(Megatron's vocab-parallel cross entropy upcasts the logits).

Megatron computed the scores with ``baddbmm`` on [b*a, s, d] views (alpha = 1/sqrt(d));
here the same GEMMs are 4-D ``matmul`` on [b, a, s, d] (Megatron-LM v1's form, which scaled
the query before QK^T), so the head dimension stays a separate, shardable dim. FLOPs and
bytes are the same up to the b*s*h query scaling.

Defaults: a 4-layer GPT (hidden 512, 8 heads, seq 512, vocab 32000, dropout 0.1); override
any field with AUTOPLAN_GPTM_<FIELD>, e.g. AUTOPLAN_GPTM_N_LAYER=24.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, fields

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class MegatronGPTConfig:
    n_layer: int = 4
    n_head: int = 8
    n_embd: int = 512
    vocab_size: int = 32000
    seq_len: int = 512
    hidden_dropout: float = 0.1  # Megatron-LM's --hidden-dropout default
    attention_dropout: float = 0.1  # Megatron-LM's --attention-dropout default

    def with_env(self, prefix: str) -> "MegatronGPTConfig":
        for f in fields(self):
            value = os.environ.get(f"{prefix}_{f.name.upper()}")
            if value is not None:
                setattr(self, f.name, type(getattr(self, f.name))(value))
        return self


class MegatronAttention(nn.Module):
    def __init__(self, config: MegatronGPTConfig) -> None:
        super().__init__()
        self.heads, self.head_dim = config.n_head, config.n_embd // config.n_head
        self.query_key_value = nn.Linear(config.n_embd, 3 * config.n_embd)
        self.dense = nn.Linear(config.n_embd, config.n_embd)
        self.attention_dropout = nn.Dropout(config.attention_dropout)
        causal = torch.ones(config.seq_len, config.seq_len, dtype=torch.bool).triu(1)
        self.register_buffer("causal_mask", causal, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        mixed = self.query_key_value(x).view(b, s, self.heads, 3 * self.head_dim)
        q, k, v = (t.transpose(1, 2) for t in mixed.split(self.head_dim, dim=-1))  # [b, a, s, d] each
        scores = torch.matmul(q / math.sqrt(self.head_dim), k.transpose(-2, -1))  # [b, a, s, s]
        probs = torch.softmax(scores.masked_fill(self.causal_mask[:s, :s], float("-inf")), dim=-1)
        probs = self.attention_dropout(probs)
        context = torch.matmul(probs, v).transpose(1, 2).reshape(b, s, h)
        return self.dense(context)


class MegatronMLP(nn.Module):
    def __init__(self, config: MegatronGPTConfig) -> None:
        super().__init__()
        self.dense_h_to_4h = nn.Linear(config.n_embd, 4 * config.n_embd)
        self.dense_4h_to_h = nn.Linear(4 * config.n_embd, config.n_embd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dense_4h_to_h(F.gelu(self.dense_h_to_4h(x)))


class MegatronLayer(nn.Module):
    def __init__(self, config: MegatronGPTConfig) -> None:
        super().__init__()
        self.input_layernorm = nn.LayerNorm(config.n_embd)
        self.self_attention = MegatronAttention(config)
        self.post_attention_layernorm = nn.LayerNorm(config.n_embd)
        self.mlp = MegatronMLP(config)
        self.hidden_dropout = nn.Dropout(config.hidden_dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.hidden_dropout(self.self_attention(self.input_layernorm(x)))
        return x + self.hidden_dropout(self.mlp(self.post_attention_layernorm(x)))


class MegatronGPT(nn.Module):
    def __init__(self, config: MegatronGPTConfig) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(config.vocab_size, config.n_embd)
        self.position_embeddings = nn.Embedding(config.seq_len, config.n_embd)
        self.embedding_dropout = nn.Dropout(config.hidden_dropout)
        self.layers = nn.ModuleList(MegatronLayer(config) for _ in range(config.n_layer))
        self.final_layernorm = nn.LayerNorm(config.n_embd)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(idx.shape[1], device=idx.device)
        x = self.embedding_dropout(self.word_embeddings(idx) + self.position_embeddings(positions))
        for layer in self.layers:
            x = layer(x)
        return F.linear(self.final_layernorm(x), self.word_embeddings.weight)  # output head tied to the embedding


CONFIG = MegatronGPTConfig().with_env("AUTOPLAN_GPTM")


def build_model() -> nn.Module:
    return MegatronGPT(CONFIG)


def example_inputs(batch_size: int) -> tuple:
    return (torch.randint(0, CONFIG.vocab_size, (batch_size, CONFIG.seq_len)),)


def example_target(batch_size: int) -> torch.Tensor:
    return torch.randint(0, CONFIG.vocab_size, (batch_size, CONFIG.seq_len))


def loss_fn(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(output.flatten(0, 1).float(), target.flatten())
