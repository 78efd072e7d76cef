"""Hugging Face transformers GPT-2, built from a config (no weights downloaded). It does not
trace with torch.fx, so autoplan falls back to torch.export. Needs `pip install 'autoplan[hf]'`.
Sizes overridable with AUTOPLAN_HF_GPT2_<NAME> for LAYERS, DIM, HEADS, VOCAB, SEQ."""

import os

import torch
import torch.nn.functional as F

try:
    from transformers import GPT2Config, GPT2LMHeadModel
except ImportError as exc:  # one clear line from autoplan's model-file loader
    raise ImportError(
        "examples/hf_gpt2.py needs Hugging Face transformers; install it with: pip install 'autoplan[hf]'"
    ) from exc

LAYERS = int(os.environ.get("AUTOPLAN_HF_GPT2_LAYERS", 2))
DIM = int(os.environ.get("AUTOPLAN_HF_GPT2_DIM", 256))
HEADS = int(os.environ.get("AUTOPLAN_HF_GPT2_HEADS", 4))
VOCAB = int(os.environ.get("AUTOPLAN_HF_GPT2_VOCAB", 8000))
SEQ = int(os.environ.get("AUTOPLAN_HF_GPT2_SEQ", 128))


def build_model():
    config = GPT2Config(
        n_layer=LAYERS,
        n_embd=DIM,
        n_head=HEADS,
        vocab_size=VOCAB,
        n_positions=SEQ,
        bos_token_id=0,
        eos_token_id=0,
        use_cache=False,
        attn_implementation="sdpa",
    )
    return GPT2LMHeadModel(config)


def example_inputs(batch_size):
    return (torch.randint(0, VOCAB, (batch_size, SEQ)),)


def example_target(batch_size):
    return torch.randint(0, VOCAB, (batch_size, SEQ))


def loss_fn(output, target):
    logits = output["logits"]
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), target.reshape(-1))
