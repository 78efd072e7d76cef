"""--verify: one distributed step against a single-process reference.

The reference is the same model (same seed, so the same initial weights) run unsharded in
this process over the same micro-batches in the same order: for every dp rank d and
micro-batch m, ``loss(d, m) / (dp * num_microbatches)`` is back-propagated, which is what the
distributed step computes for any loss that is a mean over its micro-batch (and per-micro-batch
statistics such as BatchNorm's stay identical). Each rank compares the gradients of the
parameters it holds (DTensor shards gathered with ``full_tensor()``, names mapped back to the
original FQNs) and the loss; rank results are gathered so every rank returns the same verdict.

**Same precision policy.** The reference computes with the run's
:class:`~autoplan.execute.precision.PrecisionPolicy`: under FSDP2 (``cast_params``) its
parameters and floating inputs are cast to bf16/fp16 and each micro-batch's low-precision
gradients are accumulated in fp32 (as FSDP2 accumulates and reduces in ``reduce_dtype``);
otherwise it runs under the same autocast with fp32 parameters. fp16 back-propagates the loss
times the scaler's initial scale and divides the gradients by it, as the run's first step does.
So the only differences left are those of sharding: reductions split across ranks and summed
in another order.

**Error measure** (per tensor, not dominated by near-zero elements):
``rel = ||g - g_ref||_2 / max(||g_ref||_2, FLOOR * ||G_ref||_2)``, with ``G_ref`` all reference
gradients together: a tensor whose gradient is mathematically zero (a key bias before a
softmax) is judged against 1e-3 of the model's gradient norm instead of its own rounding noise.
Tolerances: a few units of roundoff of the compute dtype, amplified by reductions in another
order (about 8-10 units): fp32 1e-4; bf16 3e-2 (unit roundoff 2^-8 = 3.9e-3); fp16 5e-3
(2^-11 = 4.9e-4). A wrong scaling, a missing reduction or a wrong shard is off by O(1).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.tensor import DTensor

from autoplan.execute import precision
from autoplan.execute.batch import shard_batch
from autoplan.execute.data_parallel import dp_mode
from autoplan.execute.grad_scaler import INIT_SCALE
from autoplan.execute.trainer import Trainer
from autoplan.types.plan import Plan

TOLERANCE = {"fp32": 1e-4, "bf16": 3e-2, "fp16": 5e-3}
FLOOR = 1e-3
WRAPPER_PREFIXES = ("module.", "_orig_mod.")


@dataclass
class Difference:
    name: str
    error_norm: float          # ||g - g_ref||_2 (|loss - loss_ref| for the loss)
    ref_norm: float            # ||g_ref||_2
    floor: float = 0.0         # FLOOR * ||G_ref||_2
    max_abs_diff: float = 0.0  # max |g - g_ref|, for the table

    @property
    def relative(self) -> float:
        if not math.isfinite(self.error_norm):
            return math.inf
        return self.error_norm / max(self.ref_norm, self.floor, 1e-30)


def reference_step(*, model: nn.Module, plan: Plan, inputs: tuple, target: Any, loss_fn: Callable,
                   policy: precision.PrecisionPolicy | None = None,
                   loss_scale: float | None = None) -> tuple[float, dict[str, torch.Tensor]]:
    """Loss and fp32 gradients of ``model`` over the global batch, micro-batch by micro-batch,
    under the run's precision policy (module docstring). Casts ``model`` in place under FSDP2's."""
    policy = policy or precision.policy_for(precision=plan.precision, dp_mode=dp_mode(plan=plan),
                                                reduce_dtype=plan.grad_reduce_dtype)
    scale = loss_scale if loss_scale is not None else (INIT_SCALE if policy.scales_loss else 1.0)
    precision.cast_parameters(model, policy)
    device_type = next(model.parameters()).device.type
    parts, total, grads = plan.dp * plan.num_microbatches, 0.0, {}
    for index in range(parts):
        x = shard_batch(tuple(inputs), index=index, parts=parts, batch_size=plan.global_batch_size)
        y = shard_batch(target, index=index, parts=parts, batch_size=plan.global_batch_size)
        model.zero_grad(set_to_none=True)
        with precision.autocast(policy, device_type=device_type):
            loss = loss_fn(model(*precision.cast_inputs(x, policy)), y) / parts
        (loss * scale if scale != 1.0 else loss).backward()
        total += float(loss.detach())
        for name, p in model.named_parameters():
            if p.grad is not None:
                grads[name] = grads.get(name, 0.0) + p.grad.detach().float() / scale
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
    floor = FLOOR * math.sqrt(sum(float(g.double().pow(2).sum()) for g in ref_grads.values()))
    local = [Difference("loss", abs(loss - ref_loss), abs(ref_loss))]
    for name, grad in gathered_grads(trainer).items():
        ref = ref_grads.get(name)
        if ref is None or ref.shape != grad.shape:
            local.append(Difference(f"{name} (missing or mis-shaped in the reference)", math.inf, 0.0))
            continue
        local.append(tensor_difference(name=name, grad=grad, ref=ref.cpu(), floor=floor))
    everyone: list[list[Difference]] = [None] * dist.get_world_size()  # type: ignore[list-item]
    dist.all_gather_object(everyone, local)
    merged = {}
    for rank_diffs in everyone:
        for diff in rank_diffs:
            if diff.name not in merged or diff.relative > merged[diff.name].relative:
                merged[diff.name] = diff
    for name in ref_grads.keys() - merged.keys():
        merged[name] = Difference(f"{name} (no rank produced a gradient)", math.inf, 0.0)
    return sorted(merged.values(), key=lambda d: -d.relative)


def tensor_difference(*, name: str, grad: torch.Tensor, ref: torch.Tensor, floor: float) -> Difference:
    """The norm-relative difference of one gradient (module docstring)."""
    diff = grad.double() - ref.double()
    return Difference(name, float(diff.norm()), float(ref.double().norm()), floor, float(diff.abs().max()) if diff.numel() else 0.0)


def verdict(*, diffs: list[Difference], precision_name: str) -> tuple[bool, str]:
    """(passed, a short table of the largest differences)."""
    tol = TOLERANCE[precision_name]
    lines = [f"verify ({precision_name}, tolerance {tol:g} on ||diff|| / ||reference||): {len(diffs)} tensors compared"]
    for diff in diffs[:8]:
        lines.append(f"  {diff.name:<50s} rel={diff.relative:.3e}  ||diff||={diff.error_norm:.3e}  "
                     f"||ref||={diff.ref_norm:.3e}  max|diff|={diff.max_abs_diff:.3e}")
    passed = all(d.relative <= tol for d in diffs)
    lines.append("verify: PASSED" if passed else "verify: FAILED")
    return passed, "\n".join(lines)


def disable_dropout(model: nn.Module) -> None:
    """Dropout draws different random numbers in a sharded run; turn it off for --verify."""
    for module in model.modules():
        if isinstance(module, nn.modules.dropout._DropoutNd):
            module.p = 0.0
