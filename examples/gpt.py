"""A nanoGPT-style GPT (fused qkv, SDPA, tied embeddings): 4 layers, hidden 512, 8 heads,
vocab 32000, seq 512 by default. Override any size with AUTOPLAN_GPT_<FIELD>, e.g.
AUTOPLAN_GPT_N_LAYER=12 (fields: see examples/_gpt_common.py GPTConfig)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _gpt_common import GPT, GPTConfig, cross_entropy, token_batch  # noqa: E402

CONFIG = GPTConfig(n_layer=4, n_head=8, n_embd=512, vocab_size=32000, block_size=512).with_env("AUTOPLAN_GPT")


def build_model():
    return GPT(CONFIG)


def example_inputs(batch_size):
    return (token_batch(CONFIG, batch_size),)


def example_target(batch_size):
    return token_batch(CONFIG, batch_size)


def loss_fn(output, target):
    return cross_entropy(output, target)
