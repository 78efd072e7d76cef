"""Hugging Face transformers Mixtral (sparse MoE: a top-2 router over 8 SwiGLU experts in every
layer, GQA, RMSNorm, rotary), built from its default config with smaller sizes (no weights
downloaded). Its experts route tokens with data-dependent ops (sort, histc, grouped GEMMs), which
autoplan traces under its routing model (docs/moe.md). Needs `pip install -e '.[hf]'`.
Sizes overridable with AUTOPLAN_HF_MIXTRAL_<NAME> for LAYERS, DIM, HEADS, KV_HEADS, FFN, EXPERTS,
TOP_K, VOCAB, SEQ."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _hf_common import env_size, logits_loss, token_batch  # noqa: E402

try:
    from transformers import MixtralConfig, MixtralForCausalLM
except ImportError as exc:
    raise ImportError(
        "examples/hf_mixtral.py needs Hugging Face transformers; install it with: pip install -e '.[hf]'"
    ) from exc


PREFIX = "AUTOPLAN_HF_MIXTRAL"
LAYERS = env_size(PREFIX, "LAYERS", 2)
DIM = env_size(PREFIX, "DIM", 256)
HEADS = env_size(PREFIX, "HEADS", 8)
KV_HEADS = env_size(PREFIX, "KV_HEADS", 2)
FFN = env_size(PREFIX, "FFN", 512)
EXPERTS = env_size(PREFIX, "EXPERTS", 8)
TOP_K = env_size(PREFIX, "TOP_K", 2)
VOCAB = env_size(PREFIX, "VOCAB", 8000)
SEQ = env_size(PREFIX, "SEQ", 128)


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
    return (token_batch(VOCAB, SEQ, batch_size),)


def example_target(batch_size):
    return token_batch(VOCAB, SEQ, batch_size)


loss_fn = logits_loss
