"""Hugging Face transformers DeepSeek-V3 (multi-head latent attention; 3 dense layers, then MoE
layers of 256 fine-grained routed experts, top-8 with group-limited routing, plus 1 shared expert),
at its published size (671B parameters) by default, built on the meta device (no weights
downloaded). autoplan traces its routing under the routing model (docs/moe.md). Needs
`pip install -e '.[hf]'`. Sizes overridable with AUTOPLAN_HF_DSV3_<NAME> for LAYERS, DENSE,
DIM, HEADS, FFN, MOE_FFN, EXPERTS, TOP_K, VOCAB, SEQ."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _hf_common import env_size, logits_loss, token_batch  # noqa: E402

try:
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM
except ImportError as exc:
    raise ImportError(
        "examples/hf_deepseek_v3.py needs Hugging Face transformers; install it with: pip install -e '.[hf]'"
    ) from exc


PREFIX = "AUTOPLAN_HF_DSV3"
# DeepSeek-V3 technical report (arXiv 2412.19437) section 4.2 and its released config.json
LAYERS = env_size(PREFIX, "LAYERS", 61)
DENSE = env_size(PREFIX, "DENSE", 3)
DIM = env_size(PREFIX, "DIM", 7168)
HEADS = env_size(PREFIX, "HEADS", 128)
FFN = env_size(PREFIX, "FFN", 18432)
MOE_FFN = env_size(PREFIX, "MOE_FFN", 2048)
EXPERTS = env_size(PREFIX, "EXPERTS", 256)
TOP_K = env_size(PREFIX, "TOP_K", 8)
VOCAB = env_size(PREFIX, "VOCAB", 129280)
SEQ = env_size(PREFIX, "SEQ", 4096)


def build_model():
    config = DeepseekV3Config(
        num_hidden_layers=LAYERS,
        first_k_dense_replace=DENSE,
        hidden_size=DIM,
        num_attention_heads=HEADS,
        num_key_value_heads=HEADS,
        intermediate_size=FFN,
        moe_intermediate_size=MOE_FFN,
        n_routed_experts=EXPERTS,
        num_experts_per_tok=TOP_K,
        n_shared_experts=1,
        n_group=8,
        topk_group=4,
        vocab_size=VOCAB,
        max_position_embeddings=SEQ,
        use_cache=False,
    )
    return DeepseekV3ForCausalLM(config)


def example_inputs(batch_size):
    return (token_batch(VOCAB, SEQ, batch_size),)


def example_target(batch_size):
    return token_batch(VOCAB, SEQ, batch_size)


loss_fn = logits_loss
