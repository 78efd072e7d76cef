"""Hugging Face transformers Llama (GQA, RMSNorm, SwiGLU, rotary), built from a config (no
weights downloaded); traced through the torch.export fallback. Needs `pip install 'autoplan[hf]'`.
Sizes overridable with AUTOPLAN_HF_LLAMA_<NAME> for LAYERS, DIM, HEADS, KV_HEADS, FFN, VOCAB, SEQ."""

import os

import torch
import torch.nn.functional as F

try:
    from transformers import LlamaConfig, LlamaForCausalLM
except ImportError as exc:
    raise ImportError(
        "examples/hf_llama.py needs Hugging Face transformers; install it with: pip install 'autoplan[hf]'"
    ) from exc

LAYERS = int(os.environ.get("AUTOPLAN_HF_LLAMA_LAYERS", 2))
DIM = int(os.environ.get("AUTOPLAN_HF_LLAMA_DIM", 256))
HEADS = int(os.environ.get("AUTOPLAN_HF_LLAMA_HEADS", 8))
KV_HEADS = int(os.environ.get("AUTOPLAN_HF_LLAMA_KV_HEADS", 2))
FFN = int(os.environ.get("AUTOPLAN_HF_LLAMA_FFN", 688))
VOCAB = int(os.environ.get("AUTOPLAN_HF_LLAMA_VOCAB", 8000))
SEQ = int(os.environ.get("AUTOPLAN_HF_LLAMA_SEQ", 128))


def build_model():
    config = LlamaConfig(
        num_hidden_layers=LAYERS,
        hidden_size=DIM,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        intermediate_size=FFN,
        vocab_size=VOCAB,
        max_position_embeddings=SEQ,
        bos_token_id=0,
        eos_token_id=0,
        pad_token_id=0,
        use_cache=False,
        attn_implementation="sdpa",
    )
    return LlamaForCausalLM(config)


def example_inputs(batch_size):
    return (torch.randint(0, VOCAB, (batch_size, SEQ)),)


def example_target(batch_size):
    return torch.randint(0, VOCAB, (batch_size, SEQ))


def loss_fn(output, target):
    logits = output["logits"]
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), target.reshape(-1))
