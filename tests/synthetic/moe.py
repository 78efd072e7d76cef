"""A small Hugging Face Mixtral traced once per test session: the MoE graph the cost-model tests of
expert parallelism and of the experts' own layout share (8 experts, top-2, 4 layers)."""

from __future__ import annotations

import functools

MIXTRAL_EXPERTS, MIXTRAL_BATCH = 8, 32


@functools.cache
def mixtral_graph():
    """The traced graph (batch 32, sequence 128); needs transformers."""
    import torch
    from transformers import MixtralConfig, MixtralForCausalLM

    from autoplan.trace import trace

    config = MixtralConfig(
        num_hidden_layers=4,
        hidden_size=256,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=512,
        num_local_experts=MIXTRAL_EXPERTS,
        num_experts_per_tok=2,
        vocab_size=1024,
        max_position_embeddings=128,
        use_cache=False,
    )
    with torch.device("meta"):
        model = MixtralForCausalLM(config)
    return trace(model, (torch.randint(0, 1024, (MIXTRAL_BATCH, 128)),))
