"""LoRA fine-tuning of examples/llama.py's Llama (Hu et al. 2021, "LoRA", section 4.1): every
linear of attention and the MLP gets rank-r adapters A (r x in) and B (out x r), y = W x + (alpha / r)
B A x, with B = 0 at the start; the base weights, the embedding, the norms and the output head are
frozen (``requires_grad=False``), so only the adapters get gradients, optimizer state and sync.

Built on the meta device (tracing and planning never allocate weights; ``autoplan run``
materialises it with :meth:`LoRALlama.init_weights`). Sizes: examples/llama.py's CONFIG and its
AUTOPLAN_LLAMA_<FIELD> overrides; AUTOPLAN_LORA_SHAPE=70b takes Llama 3 70B's shape (Dubey et al.
2024, table 3: 80 layers, dim 8192, 64 heads, 8 KV heads, FFN 28672, vocab 128256) at sequence
length AUTOPLAN_LLAMA_SEQ_LEN (default 256). AUTOPLAN_LORA_RANK (default 16) and AUTOPLAN_LORA_ALPHA
(default 32); AUTOPLAN_LORA_RANK=0 trains the whole model (full fine-tuning, the same weights)."""

import math
import os
import sys
from dataclasses import replace
from pathlib import Path

import torch
import torch.nn as nn

sys.path.insert(0, str(Path(__file__).parent))
from llama import CONFIG as BASE_CONFIG  # noqa: E402
from llama import Llama, LlamaConfig, loss_fn  # noqa: E402, F401

SHAPES = {"70b": dict(n_layers=80, dim=8192, n_heads=64, n_kv_heads=8, ffn_dim=28672, vocab_size=128256)}
TARGETS = ("wq", "wk", "wv", "wo", "w1", "w2", "w3")  # the linears that get adapters


def _config() -> LlamaConfig:
    shape = os.environ.get("AUTOPLAN_LORA_SHAPE", "")
    if shape and shape not in SHAPES:
        raise ValueError(f"AUTOPLAN_LORA_SHAPE={shape!r}; expected one of {', '.join(SHAPES)} or unset.")
    return replace(BASE_CONFIG, **SHAPES.get(shape, {}))


CONFIG = _config()
RANK = int(os.environ.get("AUTOPLAN_LORA_RANK", "16"))
ALPHA = float(os.environ.get("AUTOPLAN_LORA_ALPHA", "32"))


class LoRALinear(nn.Module):
    """A frozen linear plus its trainable low-rank update (module docstring)."""

    def __init__(self, base: nn.Linear, *, rank: int, alpha: float):
        super().__init__()
        self.base, self.scale = base, alpha / rank
        self.lora_a = nn.Linear(base.in_features, rank, bias=False, device=base.weight.device)
        self.lora_b = nn.Linear(rank, base.out_features, bias=False, device=base.weight.device)
        base.requires_grad_(False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """LoRA's initialisation: A Kaiming-uniform, B zero (the update starts at 0)."""
        nn.init.kaiming_uniform_(self.lora_a.weight, a=math.sqrt(5))
        nn.init.zeros_(self.lora_b.weight)

    def forward(self, x):
        return self.base(x) + self.lora_b(self.lora_a(x)) * self.scale


class LoRALlama(Llama):
    """examples/llama.py's Llama with adapters on every TARGETS linear and everything else frozen."""

    def __init__(self, c: LlamaConfig, *, rank: int, alpha: float):
        super().__init__(c)
        if rank == 0:
            return
        self.requires_grad_(False)
        for layer in self.layers:
            for owner in (layer.attention, layer.feed_forward):
                for name in TARGETS:
                    if isinstance(getattr(owner, name, None), nn.Linear):
                        setattr(owner, name, LoRALinear(getattr(owner, name), rank=rank, alpha=alpha))

    @torch.no_grad()
    def init_weights(self) -> None:
        """Initialise every parameter and the rotary buffer after a meta build (autoplan's
        materialiser calls it): each module's own reset, the adapters' last."""
        for module in self.modules():
            if module is not self and not isinstance(module, LoRALinear) and hasattr(module, "reset_parameters"):
                module.reset_parameters()
        for module in self.modules():
            if isinstance(module, LoRALinear):
                module.reset_parameters()
        head_dim = self.inv_freq.numel() * 2
        self.inv_freq.copy_(1.0 / (CONFIG.rope_theta ** (torch.arange(0, head_dim, 2).float() / head_dim)))


def build_model():
    with torch.device("meta"):
        return LoRALlama(CONFIG, rank=RANK, alpha=ALPHA)


def example_inputs(batch_size):
    return (torch.randint(0, CONFIG.vocab_size, (batch_size, CONFIG.seq_len)),)


def example_target(batch_size):
    return torch.randint(0, CONFIG.vocab_size, (batch_size, CONFIG.seq_len))
