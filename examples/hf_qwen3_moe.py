"""Hugging Face transformers Qwen3-MoE (128 fine-grained routed experts, top-8, no shared expert,
GQA with 4 KV heads and a 128-wide head, QK-norm), at Qwen3-30B-A3B's published size by default,
built on the meta device (no weights downloaded). autoplan traces its routing under the routing
model (docs/moe.md). Needs `pip install -e '.[hf]'`. Sizes overridable with
AUTOPLAN_HF_QWEN3_MOE_<NAME> for LAYERS, DIM, HEADS, KV_HEADS, HEAD_DIM, MOE_FFN, EXPERTS,
TOP_K, VOCAB, SEQ."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _hf_common import env_size, logits_loss, token_batch  # noqa: E402

try:
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM
except ImportError as exc:
    raise ImportError(
        "examples/hf_qwen3_moe.py needs Hugging Face transformers; install it with: pip install -e '.[hf]'"
    ) from exc


PREFIX = "AUTOPLAN_HF_QWEN3_MOE"
# Qwen3-30B-A3B's released config.json (huggingface.co/Qwen/Qwen3-30B-A3B)
LAYERS = env_size(PREFIX, "LAYERS", 48)
DIM = env_size(PREFIX, "DIM", 2048)
HEADS = env_size(PREFIX, "HEADS", 32)
KV_HEADS = env_size(PREFIX, "KV_HEADS", 4)
HEAD_DIM = env_size(PREFIX, "HEAD_DIM", 128)
MOE_FFN = env_size(PREFIX, "MOE_FFN", 768)
EXPERTS = env_size(PREFIX, "EXPERTS", 128)
TOP_K = env_size(PREFIX, "TOP_K", 8)
VOCAB = env_size(PREFIX, "VOCAB", 151936)
SEQ = env_size(PREFIX, "SEQ", 4096)


def build_model():
    config = Qwen3MoeConfig(
        num_hidden_layers=LAYERS,
        hidden_size=DIM,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        head_dim=HEAD_DIM,
        moe_intermediate_size=MOE_FFN,
        num_experts=EXPERTS,
        num_experts_per_tok=TOP_K,
        norm_topk_prob=True,
        vocab_size=VOCAB,
        max_position_embeddings=SEQ,
        use_cache=False,
    )
    return Qwen3MoeForCausalLM(config)


def example_inputs(batch_size):
    return (token_batch(VOCAB, SEQ, batch_size),)


def example_target(batch_size):
    return token_batch(VOCAB, SEQ, batch_size)


loss_fn = logits_loss
