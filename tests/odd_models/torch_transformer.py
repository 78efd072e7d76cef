"""The PyTorch tutorial's language model ("Language Modeling with nn.Transformer"): torch's own
``nn.TransformerEncoder`` of ``nn.TransformerEncoderLayer`` (``nn.MultiheadAttention`` inside), sequence-first
([S, B, D]), a sinusoidal position buffer sliced to the sequence, a square subsequent mask with ``is_causal``, and
its default dropout (0.2, in attention too)."""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

VOCAB, SEQ, DIM, HEADS, FFN, LAYERS = 200, 16, 32, 4, 64, 2


class PositionalEncoding(nn.Module):
    def __init__(self, d_model: int, max_len: int = 64):
        super().__init__()
        position = torch.arange(max_len).unsqueeze(1)
        div_term = torch.exp(torch.arange(0, d_model, 2) * (-math.log(10000.0) / d_model))
        pe = torch.zeros(max_len, 1, d_model)
        pe[:, 0, 0::2] = torch.sin(position * div_term)
        pe[:, 0, 1::2] = torch.cos(position * div_term)
        self.register_buffer("pe", pe)

    def forward(self, x):
        return x + self.pe[: x.size(0)]


class TransformerModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.embedding = nn.Embedding(VOCAB, DIM)
        self.pos_encoder = PositionalEncoding(DIM)
        layer = nn.TransformerEncoderLayer(DIM, HEADS, FFN, dropout=0.2)
        self.transformer_encoder = nn.TransformerEncoder(layer, LAYERS, enable_nested_tensor=False)
        self.linear = nn.Linear(DIM, VOCAB)

    def forward(self, src):
        src = self.pos_encoder(self.embedding(src.t()) * math.sqrt(DIM))  # [S, B, D]
        mask = nn.Transformer.generate_square_subsequent_mask(src.size(0), device=src.device)
        out = self.transformer_encoder(src, mask, is_causal=True)
        return self.linear(out).transpose(0, 1)


def build_model():
    return TransformerModel()


def example_inputs(batch_size):
    return (torch.randint(0, VOCAB, (batch_size, SEQ)),)


def example_target(batch_size):
    return torch.randint(0, VOCAB, (batch_size, SEQ))


def loss_fn(out, target):
    return F.cross_entropy(out.reshape(-1, VOCAB), target.reshape(-1))
