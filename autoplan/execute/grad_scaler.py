"""Dynamic loss scaling for fp16 that works for every sharding (DDP, FSDP2, TP, pipelines).

Formulation (Micikevicius et al. 2018, "Mixed Precision Training", section 3.2; the same
constants and update rule as ``torch.amp.GradScaler``): back-propagate ``S * loss`` so small
gradients stay above fp16's underflow, then, after the gradients are synchronised, multiply
every local gradient (the local shard of a DTensor) by ``1/S`` in fp32 and check it is finite.
The "found inf" flag is all-reduced (MAX) over the whole job, because each rank holds
different shards and every rank must skip or take the step together. Then
``S <- S * backoff`` on an overflow, ``S <- S * growth`` after ``growth_interval`` clean
steps.

``torch.amp.GradScaler`` checks only this rank's gradients, so with FSDP2 shards, tp shards
or pipeline stages one rank could step while another skips; hence this scaler.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn

from autoplan.execute.data_parallel import local

INIT_SCALE = 2.0**16


class ShardedGradScaler:
    """Loss scale ``scale``; ``unscale_(params)`` -> found_inf (job-wide); ``update(found_inf)``."""

    def __init__(
        self,
        *,
        device: torch.device,
        init_scale: float = INIT_SCALE,
        growth_factor: float = 2.0,
        backoff_factor: float = 0.5,
        growth_interval: int = 2000,
    ):
        self.device = device
        self.scale = float(init_scale)
        self.growth_factor, self.backoff_factor = growth_factor, backoff_factor
        self.growth_interval = growth_interval
        self.clean_steps = 0
        self.skipped_steps = 0

    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        return loss * self.scale

    @torch.no_grad()
    def unscale_(self, params: list[nn.Parameter]) -> bool:
        """Divide every gradient by the scale; True when any rank saw inf or NaN."""
        found = torch.zeros(1, device=self.device)
        for param in params:
            if param.grad is None:
                continue
            grad = local(param.grad)
            grad.mul_(1.0 / self.scale)
            found = torch.maximum(found, (~torch.isfinite(grad)).any().float().reshape(1).to(self.device))
        if dist.is_initialized():
            dist.all_reduce(found, op=dist.ReduceOp.MAX)
        return bool(found.item() > 0)

    def update(self, found_inf: bool) -> None:
        if found_inf:
            self.scale *= self.backoff_factor
            self.clean_steps = 0
            self.skipped_steps += 1
            return
        self.clean_steps += 1
        if self.clean_steps >= self.growth_interval:
            self.scale *= self.growth_factor
            self.clean_steps = 0
