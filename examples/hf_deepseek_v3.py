"""Hugging Face transformers DeepSeek-V3 (multi-head latent attention; 3 dense layers, then MoE
layers of 256 fine-grained routed experts, top-8 with group-limited routing, plus 1 shared expert),
at its published size (671B parameters) by default, built on the meta device (no weights
downloaded). autoplan traces its routing under the routing model (docs/moe.md). Needs
`pip install 'autoplan[hf]'`. Sizes overridable with AUTOPLAN_HF_DSV3_<NAME> for LAYERS, DENSE,
DIM, HEADS, FFN, MOE_FFN, EXPERTS, TOP_K, VOCAB, SEQ."""

import os

import torch
import torch.nn.functional as F

try:
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM
except ImportError as exc:
    raise ImportError(
        "examples/hf_deepseek_v3.py needs Hugging Face transformers; install it with: pip install 'autoplan[hf]'"
    ) from exc


def _size(name: str, default: int) -> int:
    return int(os.environ.get(f"AUTOPLAN_HF_DSV3_{name}", default))


# DeepSeek-V3 technical report (arXiv 2412.19437) section 4.2 and its released config.json
LAYERS, DENSE, DIM, HEADS = _size("LAYERS", 61), _size("DENSE", 3), _size("DIM", 7168), _size("HEADS", 128)
FFN, MOE_FFN, EXPERTS, TOP_K = _size("FFN", 18432), _size("MOE_FFN", 2048), _size("EXPERTS", 256), _size("TOP_K", 8)
VOCAB, SEQ = _size("VOCAB", 129280), _size("SEQ", 4096)


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
    return (torch.randint(0, VOCAB, (batch_size, SEQ)),)


def example_target(batch_size):
    return torch.randint(0, VOCAB, (batch_size, SEQ))


def loss_fn(output, target):
    logits = output["logits"]
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), target.reshape(-1))
