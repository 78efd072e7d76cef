"""Under context parallelism, each micro-batch's loss weight on a cp rank where the targets skip tokens
(docs/executor.md, "Context parallelism").

Each cp rank's loss is the mean over its shard's scored tokens, and the ranks' losses are averaged: the whole
micro-batch's mean only where every shard scores as many tokens. Targets that skip tokens (-100: padding, a
prompt, masked-LM's unmasked tokens) weigh micro-batch i's loss on rank r by

    w_i = n_r cp / n          (n_r the tokens rank r's shard scores, n the micro-batch's)

so the mean over the cp ranks of w_i mean_r is sum_r n_r mean_r / n, the micro-batch's mean over all its scored
tokens, as Megatron-LM sums losses and token counts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

#: the target value torch's cross-entropy (and Hugging Face's labels) skip
IGNORE_INDEX = -100


@dataclass
class TokenWeights:
    """Each micro-batch's weight w_i on this rank (module docstring), found by the target it is called with."""

    target: torch.Tensor  # this rank's shard of the dp share: the micro-batches' targets are views of it
    rows: int
    weights: list[float]

    def of(self, target: Any) -> float:
        """The weight of the micro-batch whose target (a view of :attr:`target`) is ``target``; 1 otherwise."""
        if not isinstance(target, torch.Tensor) or target.untyped_storage().data_ptr() != self._storage():
            return 1.0
        index = (target.storage_offset() - self.target.storage_offset()) // (self.rows * self.target.stride(0))
        return self.weights[index] if 0 <= index < len(self.weights) else 1.0

    def _storage(self) -> int:
        return self.target.untyped_storage().data_ptr()


def token_weights(target: Any, shard: Any, *, rows: int, cp: int) -> TokenWeights | None:
    """Each micro-batch's weight on this rank, from the dp share of the target (``target``) and this rank's shard of
    it (``shard``, the tensor the micro-batches of ``rows`` rows are views of); None unless the target skips tokens
    (``IGNORE_INDEX``)."""
    skips = isinstance(target, torch.Tensor) and not target.is_floating_point() and target.dim() >= 2
    if not skips or not bool((target == IGNORE_INDEX).any()):
        return None
    weights = []
    for whole, mine in zip(target.split(rows), shard.split(rows)):
        scored = int((whole != IGNORE_INDEX).sum())
        weights.append(int((mine != IGNORE_INDEX).sum()) * cp / scored if scored else 1.0)
    return TokenWeights(target=shard, rows=rows, weights=weights)
