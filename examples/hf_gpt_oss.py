"""Hugging Face transformers GPT-OSS (128 routed experts, top-4, with biases and a clamped
SwiGLU; attention with sinks, alternating 128-token sliding-window and full layers), at
gpt-oss-120b's published size by default, built on the meta device (no weights downloaded).
autoplan traces its routing under the routing model (docs/moe.md). Needs
`pip install -e '.[hf]'`. Sizes overridable with AUTOPLAN_HF_GPT_OSS_<NAME> for LAYERS, DIM,
HEADS, KV_HEADS, HEAD_DIM, FFN, EXPERTS, TOP_K, VOCAB, SEQ."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _hf_common import env_size, logits_loss, token_batch  # noqa: E402

try:
    from transformers import GptOssConfig, GptOssForCausalLM
except ImportError as exc:
    raise ImportError(
        "examples/hf_gpt_oss.py needs Hugging Face transformers; install it with: pip install -e '.[hf]'"
    ) from exc


PREFIX = "AUTOPLAN_HF_GPT_OSS"
# gpt-oss-120b's released config.json (huggingface.co/openai/gpt-oss-120b)
LAYERS = env_size(PREFIX, "LAYERS", 36)
DIM = env_size(PREFIX, "DIM", 2880)
HEADS = env_size(PREFIX, "HEADS", 64)
KV_HEADS = env_size(PREFIX, "KV_HEADS", 8)
HEAD_DIM = env_size(PREFIX, "HEAD_DIM", 64)
FFN = env_size(PREFIX, "FFN", 2880)
EXPERTS = env_size(PREFIX, "EXPERTS", 128)
TOP_K = env_size(PREFIX, "TOP_K", 4)
VOCAB = env_size(PREFIX, "VOCAB", 201088)
SEQ = env_size(PREFIX, "SEQ", 4096)


def build_model():
    config = GptOssConfig(
        num_hidden_layers=LAYERS,
        hidden_size=DIM,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        head_dim=HEAD_DIM,
        intermediate_size=FFN,
        num_local_experts=EXPERTS,
        num_experts_per_tok=TOP_K,
        vocab_size=VOCAB,
        max_position_embeddings=SEQ,
        use_cache=False,
    )
    return GptOssForCausalLM(config)


def example_inputs(batch_size):
    return (token_batch(VOCAB, SEQ, batch_size),)


def example_target(batch_size):
    return token_batch(VOCAB, SEQ, batch_size)


loss_fn = logits_loss
