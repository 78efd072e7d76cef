"""Hugging Face transformers Mixtral (sparse MoE: a top-2 router over 8 SwiGLU experts in every
layer, GQA, RMSNorm, rotary), built from its default config with smaller sizes (no weights
downloaded). Its experts route tokens with data-dependent ops (sort, histc, grouped GEMMs), which
autoplan traces under its routing model (docs/moe.md). Needs `pip install 'autoplan[hf]'`.
Sizes overridable with AUTOPLAN_HF_MIXTRAL_<NAME> for LAYERS, DIM, HEADS, KV_HEADS, FFN, EXPERTS,
TOP_K, VOCAB, SEQ."""

import os

import torch
import torch.nn.functional as F

try:
    from transformers import MixtralConfig, MixtralForCausalLM
except ImportError as exc:
    raise ImportError(
        "examples/hf_mixtral.py needs Hugging Face transformers; install it with: pip install 'autoplan[hf]'"
    ) from exc


def _size(name: str, default: int) -> int:
    return int(os.environ.get(f"AUTOPLAN_HF_MIXTRAL_{name}", default))


LAYERS, DIM, HEADS, KV_HEADS = _size("LAYERS", 2), _size("DIM", 256), _size("HEADS", 8), _size("KV_HEADS", 2)
FFN, EXPERTS, TOP_K = _size("FFN", 512), _size("EXPERTS", 8), _size("TOP_K", 2)
VOCAB, SEQ = _size("VOCAB", 8000), _size("SEQ", 128)


def build_model():
    config = MixtralConfig(
        num_hidden_layers=LAYERS,
        hidden_size=DIM,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        intermediate_size=FFN,
        num_local_experts=EXPERTS,
        num_experts_per_tok=TOP_K,
        vocab_size=VOCAB,
        max_position_embeddings=SEQ,
        use_cache=False,
    )
    return MixtralForCausalLM(config)


def example_inputs(batch_size):
    return (torch.randint(0, VOCAB, (batch_size, SEQ)),)


def example_target(batch_size):
    return torch.randint(0, VOCAB, (batch_size, SEQ))


def loss_fn(output, target):
    logits = output["logits"]
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), target.reshape(-1))
