"""Hugging Face ``MistralForCausalLM`` at a sliding window shorter than its sequence (8 of 32 tokens), 2 layers,
built from a config (no weights downloaded): its SDPA takes the window as an explicit [B, 1, S, S] mask, made
before the first block, in eager mode as well as traced."""

import torch
import torch.nn.functional as F
from transformers import MistralConfig, MistralForCausalLM

SEQ, VOCAB = 32, 256


def build_model():
    config = MistralConfig(
        num_hidden_layers=2,
        hidden_size=64,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=128,
        vocab_size=VOCAB,
        max_position_embeddings=SEQ,
        sliding_window=8,
        use_cache=False,
        attn_implementation="sdpa",
        pad_token_id=0,
        bos_token_id=0,
        eos_token_id=0,
    )
    return MistralForCausalLM(config)


def example_inputs(batch_size):
    return (torch.randint(0, VOCAB, (batch_size, SEQ)),)


def example_target(batch_size):
    return torch.randint(0, VOCAB, (batch_size, SEQ))


def loss_fn(output, target):
    logits = output["logits"]
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), target.reshape(-1))
