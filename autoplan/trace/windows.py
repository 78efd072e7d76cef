"""Sliding-window attention read from the module that runs it: each attention node (an SDPA call, or
the activation matmuls of an eager attention) gets ``attrs["window"]``, the keys each query sees, so
the cost model prices the tiles a fused kernel visits (types/attention.py; docs/cost-model.md,
"Fused attention").

A windowed attention's mask is data (built from positions on the meta device), so the window is read
from the innermost module enclosing the node that states one, as Hugging Face's attention modules do:

- its ``sliding_window`` attribute: the window, or None for a full-attention layer (GPT-OSS, Qwen2,
  Gemma 2/3 set it per layer from ``config.layer_types``);
- else its ``config`` with ``layer_idx``: ``config.sliding_window`` when ``config.layer_types`` is
  absent or names the layer ``"sliding_attention"`` (Mistral applies its window to every layer).

A module that states neither leaves the node unwindowed (0).
"""

from __future__ import annotations

import torch

from autoplan.trace.propagate import Measured

#: the record kinds an attention's scores pass through: SDPA, or an eager attention's QK and PV matmuls
_WINDOWED_KINDS = ("attention", "matmul")


def annotate_windows(records: list[Measured], model: torch.nn.Module) -> None:
    """Set ``attrs["window"]`` on each attention or activation matmul run inside a windowed module."""
    modules = dict(model.named_modules())
    memo: dict[str, int] = {}
    for record in records:
        if record.kind not in _WINDOWED_KINDS or (record.kind == "matmul" and record.params):
            continue
        if record.module not in memo:
            memo[record.module] = _window_of_path(record.module, modules)
        if memo[record.module]:
            record.attrs["window"] = memo[record.module]


def _window_of_path(path: str, modules: dict[str, torch.nn.Module]) -> int:
    """The window the innermost module on ``path`` states (module docstring); 0 when none does."""
    parts = path.split(".") if path else []
    for depth in range(len(parts), -1, -1):
        module = modules.get(".".join(parts[:depth]))
        stated = _stated_window(module) if module is not None else None
        if stated is not None:
            return stated
    return 0


def _stated_window(module: torch.nn.Module) -> int | None:
    """The module's window (0: full attention), or None when it says nothing about one."""
    if "sliding_window" in vars(module):
        return _positive(vars(module)["sliding_window"])
    config, layer = getattr(module, "config", None), getattr(module, "layer_idx", None)
    if config is None or not isinstance(layer, int) or not hasattr(config, "sliding_window"):
        return None
    types = getattr(config, "layer_types", None)
    if types is not None and (layer >= len(types) or types[layer] != "sliding_attention"):
        return 0
    return _positive(config.sliding_window)


def _positive(value) -> int:
    return int(value) if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0
