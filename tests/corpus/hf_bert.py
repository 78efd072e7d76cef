"""Hugging Face BERT for masked-LM, built from a small config (no weights), at its default dropout."""

import torch
import torch.nn.functional as F
from transformers import BertConfig, BertForMaskedLM

VOCAB, DIM, SEQ = 512, 64, 16


def build_model():
    config = BertConfig(
        vocab_size=VOCAB,
        hidden_size=DIM,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=4 * DIM,
        max_position_embeddings=SEQ,
    )
    return BertForMaskedLM(config)


def example_inputs(batch_size):
    return (torch.randint(0, VOCAB, (batch_size, SEQ)),)


def example_target(batch_size):
    return torch.randint(0, VOCAB, (batch_size, SEQ))


def loss_fn(output, target):
    return F.cross_entropy(output.logits.reshape(-1, VOCAB), target.reshape(-1))
