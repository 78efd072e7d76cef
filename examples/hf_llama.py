"""Hugging Face transformers Llama (GQA, RMSNorm, SwiGLU, rotary), built from a config (no
weights downloaded); traced through the torch.export fallback. Needs `pip install -e '.[hf]'`.
Sizes overridable with AUTOPLAN_HF_LLAMA_<NAME> for LAYERS, DIM, HEADS, KV_HEADS, FFN, VOCAB, SEQ."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _hf_common import env_size, logits_loss, token_batch  # noqa: E402

try:
    from transformers import LlamaConfig, LlamaForCausalLM
except ImportError as exc:
    raise ImportError(
        "examples/hf_llama.py needs Hugging Face transformers; install it with: pip install -e '.[hf]'"
    ) from exc

PREFIX = "AUTOPLAN_HF_LLAMA"
LAYERS = env_size(PREFIX, "LAYERS", 2)
DIM = env_size(PREFIX, "DIM", 256)
HEADS = env_size(PREFIX, "HEADS", 8)
KV_HEADS = env_size(PREFIX, "KV_HEADS", 2)
FFN = env_size(PREFIX, "FFN", 688)
VOCAB = env_size(PREFIX, "VOCAB", 8000)
SEQ = env_size(PREFIX, "SEQ", 128)


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
    return (token_batch(VOCAB, SEQ, batch_size),)


def example_target(batch_size):
    return token_batch(VOCAB, SEQ, batch_size)


loss_fn = logits_loss
