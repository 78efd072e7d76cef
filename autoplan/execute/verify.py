"""--verify: one distributed step against a single-process reference.

The reference is the same model (same seed, so the same initial weights) run unsharded in
this process over the same micro-batches in the same order: for every dp rank d and
micro-batch m, ``loss(d, m) / (dp * num_microbatches)`` is back-propagated, which is what the
distributed step computes for any loss that is a mean over its micro-batch (and per-micro-batch
statistics such as BatchNorm's stay identical). Each rank compares the gradients of the
parameters it holds (DTensor shards gathered with ``full_tensor()``, names mapped back to the
original FQNs) and the loss; rank results are gathered so every rank returns the same verdict.

Differences are relative to the reference's largest magnitude: ``max|g - g_ref| /
max(max|g_ref|, 1e-12)``, with a tolerance per precision (fp32 1e-4; bf16 5e-2; fp16 1e-2):
the ~2^-8 (bf16) and ~2^-11 (fp16) unit roundoff, amplified by reductions in another order.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.tensor import DTensor

from autoplan.execute import precision
from autoplan.execute.batch import shard_batch
from autoplan.execute.trainer import Trainer
from autoplan.types.plan import Plan

TOLERANCE = {"fp32": 1e-4, "bf16": 5e-2, "fp16": 1e-2}
WRAPPER_PREFIXES = ("module.", "_orig_mod.")


@dataclass
class Difference:
    name: str
    max_abs_diff: float
    max_abs_ref: float

    @property
    def relative(self) -> float:
        return self.max_abs_diff / max(self.max_abs_ref, 1e-12)


def reference_step(*, model: nn.Module, plan: Plan, inputs: tuple, target: Any,
                   loss_fn: Callable) -> tuple[float, dict[str, torch.Tensor]]:
    """Loss and gradients of ``model`` over the global batch, micro-batch by micro-batch."""
    parts = plan.dp * plan.num_microbatches
    total = 0.0
    for index in range(parts):
        x = shard_batch(tuple(inputs), index=index, parts=parts, batch_size=plan.global_batch_size)
        y = shard_batch(target, index=index, parts=parts, batch_size=plan.global_batch_size)
        with precision.autocast(precision=plan.precision, device_type=next(model.parameters()).device.type, use_fsdp=False):
            loss = loss_fn(model(*x), y) / parts
        loss.backward()
        total += float(loss.detach())
    grads = {name: p.grad.detach().float() for name, p in model.named_parameters() if p.grad is not None}
    return total, grads


def original_name(name: str) -> str:
    for prefix in WRAPPER_PREFIXES:
        name = name.replace(prefix, "") if name.startswith(prefix) else name
    return name.replace("._checkpoint_wrapped_module", "").replace("._fsdp_wrapped_module", "")


def gathered_grads(trainer: Trainer) -> dict[str, torch.Tensor]:
    """This rank's full gradients by original FQN (a collective over its stage's dp x tp)."""
    grads = {}
    for module in trainer.stage_modules.values():
        for name, param in module.named_parameters():
            grad = param.grad
            if grad is None:
                continue
            name = original_name(name)
            grads[(trainer.aliases or {}).get(name, name)] = (grad.full_tensor() if isinstance(grad, DTensor) else grad).detach().float().cpu()
    return grads


def compare(*, trainer: Trainer, loss: float, ref_loss: float, ref_grads: dict[str, torch.Tensor]) -> list[Difference]:
    """Per-tensor differences, gathered from every rank; loss first."""
    local = [Difference("loss", abs(loss - ref_loss), abs(ref_loss))]
    for name, grad in gathered_grads(trainer).items():
        ref = ref_grads.get(name)
        if ref is None or ref.shape != grad.shape:
            local.append(Difference(f"{name} (missing or mis-shaped in the reference)", float("inf"), 0.0))
            continue
        local.append(Difference(name, float((grad - ref.cpu()).abs().max()), float(ref.abs().max())))
    everyone: list[list[Difference]] = [None] * dist.get_world_size()  # type: ignore[list-item]
    dist.all_gather_object(everyone, local)
    merged = {}
    for rank_diffs in everyone:
        for diff in rank_diffs:
            if diff.name not in merged or diff.relative > merged[diff.name].relative:
                merged[diff.name] = diff
    for name in ref_grads.keys() - merged.keys():
        merged[name] = Difference(f"{name} (no rank produced a gradient)", float("inf"), 0.0)
    return sorted(merged.values(), key=lambda d: -d.relative)


def verdict(*, diffs: list[Difference], precision_name: str) -> tuple[bool, str]:
    """(passed, a short table of the largest differences)."""
    tol = TOLERANCE[precision_name]
    lines = [f"verify ({precision_name}, tolerance {tol:g} relative to max |reference|): {len(diffs)} tensors compared"]
    for diff in diffs[:8]:
        lines.append(f"  {diff.name:<50s} max|diff|={diff.max_abs_diff:.3e}  max|ref|={diff.max_abs_ref:.3e}  rel={diff.relative:.3e}")
    passed = all(d.relative <= tol for d in diffs)
    lines.append("verify: PASSED" if passed else "verify: FAILED")
    return passed, "\n".join(lines)


def disable_dropout(model: nn.Module) -> None:
    """Dropout draws different random numbers in a sharded run; turn it off for --verify."""
    for module in model.modules():
        if isinstance(module, nn.modules.dropout._DropoutNd):
            module.p = 0.0
