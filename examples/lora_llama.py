"""LoRA fine-tuning of examples/llama.py's Llama with Hugging Face peft (Hu et al. 2021, "LoRA",
section 4.1): every linear of attention and the MLP gets rank-r adapters A (r x in) and B (out x r),
y = W x + (alpha / r) B A x, with B = 0 at the start; the base weights, the embedding, the norms and
the output head are frozen (``requires_grad=False``, peft's ``get_peft_model``), so only the adapters
get gradients, optimizer state and sync. Needs `pip install -e '.[lora]'`.

Built on the meta device (tracing and planning never allocate weights; ``autoplan run``
materialises it with :meth:`InitLlama.init_weights`). Sizes: examples/llama.py's CONFIG and its
AUTOPLAN_LLAMA_<FIELD> overrides; AUTOPLAN_LORA_SHAPE=70b takes Llama 3 70B's shape (Dubey et al.
2024, table 3: 80 layers, dim 8192, 64 heads, 8 KV heads, FFN 28672, vocab 128256) at sequence
length AUTOPLAN_LLAMA_SEQ_LEN (default 256). AUTOPLAN_LORA_RANK (default 16) and AUTOPLAN_LORA_ALPHA
(default 32); AUTOPLAN_LORA_RANK=0 trains the whole model (full fine-tuning, the same weights)."""

import os
import sys
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from llama import CONFIG as BASE_CONFIG  # noqa: E402
from llama import Llama, LlamaConfig, loss_fn  # noqa: E402, F401

try:
    from peft import LoraConfig, get_peft_model
except ImportError as exc:
    raise ImportError(
        "examples/lora_llama.py needs Hugging Face peft; install it with: pip install -e '.[lora]'"
    ) from exc

SHAPES = {"70b": dict(n_layers=80, dim=8192, n_heads=64, n_kv_heads=8, ffn_dim=28672, vocab_size=128256)}
TARGETS = ["wq", "wk", "wv", "wo", "w1", "w2", "w3"]  # the linears that get adapters


def _config() -> LlamaConfig:
    shape = os.environ.get("AUTOPLAN_LORA_SHAPE", "")
    if shape and shape not in SHAPES:
        raise ValueError(f"AUTOPLAN_LORA_SHAPE={shape!r}; expected one of {', '.join(SHAPES)} or unset.")
    return replace(BASE_CONFIG, **SHAPES.get(shape, {}))


CONFIG = _config()
RANK = int(os.environ.get("AUTOPLAN_LORA_RANK", "16"))
ALPHA = float(os.environ.get("AUTOPLAN_LORA_ALPHA", "32"))


class InitLlama(Llama):
    """examples/llama.py's Llama that can initialise itself after a meta build (torchtitan's
    ``init_weights`` convention, which autoplan's materialiser calls; peft's wrappers forward it)."""

    @torch.no_grad()
    def init_weights(self) -> None:
        """Each module's own reset, then LoRA's (A Kaiming-uniform, B zero), then the rotary table."""
        for module in self.modules():
            if module is not self and hasattr(module, "reset_parameters"):
                module.reset_parameters()
        for module in self.modules():
            for adapter in getattr(module, "lora_A", {}):
                module.reset_lora_parameters(adapter, init_lora_weights=True)
        head_dim = self.inv_freq.numel() * 2
        self.inv_freq.copy_(1.0 / (CONFIG.rope_theta ** (torch.arange(0, head_dim, 2).float() / head_dim)))


def build_model():
    with torch.device("meta"):
        model = InitLlama(CONFIG)
        if RANK == 0:
            return model
        return get_peft_model(model, LoraConfig(r=RANK, lora_alpha=ALPHA, target_modules=TARGETS))


def example_inputs(batch_size):
    return (torch.randint(0, CONFIG.vocab_size, (batch_size, CONFIG.seq_len)),)


def example_target(batch_size):
    return torch.randint(0, CONFIG.vocab_size, (batch_size, CONFIG.seq_len))
