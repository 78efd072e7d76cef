"""Hugging Face T5 (encoder-decoder), 2+2 layers at d_model 256, built from a config (no weights),
at its default dropout. Its forward takes (input_ids, attention_mask, decoder_input_ids)."""

import torch
import torch.nn.functional as F
from transformers import T5Config, T5ForConditionalGeneration

VOCAB, SEQ = 512, 16


def build_model():
    config = T5Config(
        vocab_size=VOCAB,
        d_model=256,
        d_kv=32,
        d_ff=512,
        num_layers=2,
        num_decoder_layers=2,
        num_heads=8,
        use_cache=False,
        decoder_start_token_id=0,
        pad_token_id=0,
    )
    return T5ForConditionalGeneration(config)


def example_inputs(batch_size):
    ids = torch.randint(1, VOCAB, (batch_size, SEQ))
    return (ids, torch.ones_like(ids), torch.randint(1, VOCAB, (batch_size, SEQ)))


def example_target(batch_size):
    return torch.randint(1, VOCAB, (batch_size, SEQ))


def loss_fn(output, target):
    return F.cross_entropy(output.logits.reshape(-1, VOCAB), target.reshape(-1))
