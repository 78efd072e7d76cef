"""GPT-3 175B (Brown et al. 2020, table 2.1): 96 layers, hidden 12288, 96 heads, seq 2048,
vocab 51200 (padded from 50257 as in Megatron). Same code as examples/gpt.py; it builds on
the meta device, so it never allocates its 700 GB of fp32 weights. Override sizes with
AUTOPLAN_GPT3_<FIELD>."""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from _gpt_common import GPT, GPTConfig, cross_entropy, token_batch  # noqa: E402

CONFIG = GPTConfig(n_layer=96, n_head=96, n_embd=12288, vocab_size=51200, block_size=2048).with_env("AUTOPLAN_GPT3")


def build_model():
    with torch.device("meta"):
        return GPT(CONFIG)


def example_inputs(batch_size):
    with torch.device("meta"):
        return (token_batch(CONFIG, batch_size),)


def example_target(batch_size):
    with torch.device("meta"):
        return token_batch(CONFIG, batch_size)


def loss_fn(output, target):
    return cross_entropy(output, target)
