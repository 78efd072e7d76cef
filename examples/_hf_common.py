"""What the Hugging Face examples share: sizes from the environment, a batch of token ids, and
the causal-LM loss on a transformers output (its ``logits``)."""

import os

import torch
import torch.nn.functional as F


def env_size(prefix: str, name: str, default: int) -> int:
    """``default``, unless the environment sets ``<prefix>_<name>``."""
    return int(os.environ.get(f"{prefix}_{name}", default))


def token_batch(vocab: int, seq: int, batch_size: int) -> torch.Tensor:
    return torch.randint(0, vocab, (batch_size, seq))


def logits_loss(output, target: torch.Tensor) -> torch.Tensor:
    logits = output["logits"]
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), target.reshape(-1))
