"""--verify: a distributed step against a single-process reference (the comparison and its
tolerances; autoplan/execute/job/reference.py runs it over several steps, and
autoplan/execute/rng.py turns dropout off in both). Why each rule and what was measured:
docs/executor.md, "CLI" (``--verify``) and "FP8".

The reference runs the same model (same seed and weights) unsharded over the same micro-batches
in the same order, with the run's :class:`~autoplan.execute.precision.PrecisionPolicy`, and
back-propagates ``loss(d, m) / (dp * num_microbatches)`` for every dp rank d and micro-batch m.
Per tensor, with ``G_ref`` all reference gradients together:

    rel = ||g - g_ref||_2 / max(||g_ref||_2, FLOOR * ||G_ref||_2)           FLOOR = 1e-3

Gradient tolerances (:func:`tolerance_of`, the coarser of the precision and, under dp, the reduce
dtype): fp32 1e-4, bf16 3e-2, fp16 5e-3, fp8 0.25; times ``REGROUPED_FACTOR`` = 4 in 16 bits
under ep > 1. Updated weights (:func:`updated_reference`) are judged relative to the reference's
update, 5e-2 in fp32 and 0.5 in bf16/fp16, leaving out elements whose gradient is rounding noise.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.tensor import DTensor

from autoplan.execute import float8, precision
from autoplan.execute.batch import shard_batch
from autoplan.execute.data_parallel import dp_mode
from autoplan.execute.expert_parallel import find_experts
from autoplan.execute.grad_scaler import INIT_SCALE
from autoplan.execute.job.reference_buffers import RankBuffers
from autoplan.execute.job.verify_buffers import buffer_differences
from autoplan.execute.trainer import Trainer
from autoplan.types.plan import Plan

TOLERANCE = {"fp32": 1e-4, "bf16": 3e-2, "fp16": 5e-3, "fp8": 0.25}
#: updated weights, relative to the reference update (module docstring)
UPDATE_TOLERANCE = {"fp32": 5e-2, "bf16": 0.5, "fp16": 0.5, "fp8": 0.5}
UPDATED = "(weight after the step)"
#: expert parallelism in bf16/fp16: the gradient tolerance times this (module docstring)
REGROUPED_FACTOR = 4.0
FLOOR = 1e-3
WRAPPER_PREFIXES = ("module.", "_orig_mod.")


@dataclass
class Difference:
    name: str
    error_norm: float  # ||g - g_ref||_2 (|loss - loss_ref| for the loss)
    ref_norm: float  # ||g_ref||_2
    floor: float = 0.0  # FLOOR * ||G_ref||_2
    max_abs_diff: float = 0.0  # max |g - g_ref|, for the table

    @property
    def relative(self) -> float:
        if not math.isfinite(self.error_norm):
            return math.inf
        return self.error_norm / max(self.ref_norm, self.floor, 1e-30)


def reference_step(
    *,
    model: nn.Module,
    plan: Plan,
    inputs: tuple,
    target: Any,
    loss_fn: Callable,
    policy: precision.PrecisionPolicy | None = None,
    loss_scale: float | None = None,
    prepared: bool = False,
    buffers: RankBuffers | None = None,
) -> tuple[float, dict[str, torch.Tensor]]:
    """Loss and fp32 gradients of ``model`` over the global batch, micro-batch by micro-batch,
    under the run's precision policy (module docstring). Unless ``prepared`` (by
    :func:`prepare_reference`, once), prepares ``model`` in place as the run does first. ``buffers``: each dp
    rank's buffers, which its forwards read and update (reference_buffers.py)."""
    policy = policy or policy_of(plan)
    scale = loss_scale if loss_scale is not None else (INIT_SCALE if policy.scales_loss else 1.0)
    if not prepared:
        prepare_reference(model, plan=plan, policy=policy)
    device_type = next(model.parameters()).device.type
    parts, total, grads = plan.dp * plan.num_microbatches, 0.0, {}
    buffers = buffers or RankBuffers(model, dp=plan.dp, synced_each_step=dp_mode(plan=plan) == "ddp")
    buffers.start_step(model)
    for index in range(parts):
        rank, first = divmod(index, plan.num_microbatches)
        if first == 0:
            buffers.enter(model, rank)
        x = shard_batch(tuple(inputs), index=index, parts=parts, batch_size=plan.global_batch_size)
        y = shard_batch(target, index=index, parts=parts, batch_size=plan.global_batch_size)
        model.zero_grad(set_to_none=True)
        with precision.autocast(policy, device_type=device_type):
            loss = loss_fn(model(*precision.cast_inputs(x, policy)), y) / parts
        (loss * scale if scale != 1.0 else loss).backward()
        total += float(loss.detach())
        if first == plan.num_microbatches - 1:
            buffers.leave(model, rank)
        for name, p in model.named_parameters():
            if p.grad is not None:
                grads[name] = grads.get(name, 0.0) + full_precision(_dense(p.grad.detach())) / scale
    return total, grads


def policy_of(plan: Plan) -> precision.PrecisionPolicy:
    """The precision policy the executor gives ``plan``."""
    mode = dp_mode(plan=plan)
    return precision.policy_for(precision=plan.precision, dp_mode=mode, reduce_dtype=plan.grad_reduce_dtype)


def prepare_reference(model: nn.Module, *, plan: Plan, policy: precision.PrecisionPolicy) -> None:
    """Convert ``model``'s eligible linears to FP8 (precision fp8) and cast its parameters
    (FSDP2's policy) in place, as the run does: once, before its first reference step."""
    fqns = float8.eligible_fqns(model, plan, exclude=tuple(find_experts(model)))
    float8.convert_linears(model, fqns, recipe=plan.fp8_recipe_used)
    precision.cast_parameters(model, policy)


def full_precision(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` in fp32, or complex64 where it is complex: ``.float()`` kept the real part of a complex parameter
    only (a global filter), and --verify compared a reference that had lost its imaginary part."""
    return tensor.to(torch.complex64) if tensor.is_complex() else tensor.float()


def initial_weights(model: nn.Module, *, fp32_masters: bool = True) -> dict[str, torch.Tensor]:
    """fp32 copies of ``model``'s weights by FQN, taken before the reference casts or steps; without ``fp32_masters``
    (a run that keeps no fp32 master: all but ZeRO-1) a 16-bit weight keeps its dtype, as its run steps it: an update
    too small for bf16 changed the reference's fp32 copy, not the run's weight (a LayerNorm weight 100% off)."""
    sixteen = () if fp32_masters else (torch.bfloat16, torch.float16)
    return {
        name: (p.detach() if p.dtype in sixteen else full_precision(p.detach())).clone()
        for name, p in model.named_parameters()
    }


def updated_reference(
    *, initial: dict[str, torch.Tensor], grads: dict[str, torch.Tensor], optimizer_fn: Callable | None = None
) -> dict[str, torch.Tensor]:
    """The weights after one step of the run's optimizer (the executor's default unless given)
    from ``initial`` with the reference gradients ``grads``: what the run's step must produce."""
    from autoplan.execute.api import default_optimizer

    params = {name: nn.Parameter(w.clone()) for name, w in initial.items() if name in grads}
    for name, param in params.items():
        param.grad = grads[name].to(param.device)
    (optimizer_fn or default_optimizer)(list(params.values())).step()
    return {name: p.detach() for name, p in params.items()}


def original_name(name: str) -> str:
    for prefix in WRAPPER_PREFIXES:
        name = name.replace(prefix, "") if name.startswith(prefix) else name
    return name.replace("._checkpoint_wrapped_module", "").replace("._fsdp_wrapped_module", "")


def _named_parameters(trainer: Trainer):
    """This rank's parameters by original FQN (wrapper prefixes dropped, tied aliases mapped)."""
    for module in trainer.stage_modules.values():
        for name, param in module.named_parameters():
            name = original_name(name)
            yield (trainer.aliases or {}).get(name, name), param


def _full(tensor: torch.Tensor, name: str = "", trainer: Trainer | None = None) -> torch.Tensor:
    """The whole tensor in fp32 on the CPU (a collective: DTensor shards gathered, and an expert
    parameter's ``[E / ep, ...]`` slices gathered over its ep group into ``[E, ...]``)."""
    experts = trainer.experts if trainer is not None else None
    if experts is not None and name in experts.names:
        return full_precision(experts.whole(tensor.detach())).cpu()
    return full_precision((tensor.full_tensor() if isinstance(tensor, DTensor) else tensor).detach()).cpu()


def gathered_weights(trainer: Trainer) -> dict[str, torch.Tensor]:
    """This rank's full fp32 weights by original FQN (a collective over its stage's dp x tp, or
    dp for experts), of the parameters it trains and of the frozen ones (``requires_grad=False``,
    which :func:`frozen_differences` holds unchanged): a stage may also hold an unused copy of a
    weight tied to another stage (the pipeline split keeps it), which no step touches. ZeRO-1 frees
    every gradient in its step, so there every parameter counts, as do experts (every rank of an ep
    group must take part in gathering them)."""
    experts = trainer.experts.names if trainer.experts is not None else set()
    trainer.weights_ready()
    return {
        name: _full(param, name, trainer)
        for name, param in _named_parameters(trainer)
        if param.grad is not None
        or not param.requires_grad
        or trainer.dp_mode == "zero1"
        or name in experts
        or getattr(trainer.optimizer, "on_host", False)  # ZeRO-Offload on one dp rank frees them too
    }


def frozen_differences(*, weights: dict[str, torch.Tensor], initial: dict[str, torch.Tensor]) -> list[Difference]:
    """Each frozen parameter's change over the step, which must be none (docs/executor.md, "Frozen
    parameters"): any change is an error, however small (its norm over a reference norm of 0)."""
    return [
        Difference(f"{name} (frozen)", float((_wide(weights[name]) - _wide(initial[name].cpu())).norm()), 0.0)
        for name in sorted(initial)
        if name in weights
    ]


def gathered_grads(trainer: Trainer) -> dict[str, torch.Tensor]:
    """This rank's full gradients by original FQN (a collective over its stage's dp x tp, or dp
    for experts). Under ZeRO-1 the reduced gradients are the optimizer's slices, gathered back."""
    reduced = _zero1_gradients(trainer)
    found = ((name, reduced.get(id(param), param.grad)) for name, param in _named_parameters(trainer))
    return {name: _full(grad, name, trainer) for name, grad in found if grad is not None}


def _zero1_gradients(trainer: Trainer) -> dict[int, torch.Tensor]:
    """id(param) -> its reduced gradient (DTensor when the parameter is), under ZeRO-1; else {}."""
    optimizer = trainer.optimizer
    if not hasattr(optimizer, "reduced_gradients"):
        return {}
    found = {}
    for param, grad in zip(optimizer.params, optimizer.reduced_gradients()):
        if isinstance(param, DTensor):
            grad = DTensor.from_local(grad, param.device_mesh, param.placements, run_check=False)
        found[id(param)] = grad
    return found


def compare(
    *,
    trainer: Trainer,
    loss: float,
    ref_loss: float,
    ref_grads: dict[str, torch.Tensor],
    initial: dict[str, torch.Tensor] | None = None,
    ref_updated: dict[str, torch.Tensor] | None = None,
    weights: dict[str, torch.Tensor] | None = None,
    ref_buffers: dict[str, torch.Tensor] | None = None,
    frozen: dict[str, torch.Tensor] | None = None,
) -> list[Difference]:
    """Per-tensor differences, gathered from every rank; loss first. With ``initial`` and
    ``ref_updated`` (:func:`updated_reference`) the weights after the optimizer step are compared
    too (module docstring): ``weights`` (:func:`gathered_weights`), when the caller has them; with
    ``ref_buffers`` (this rank's dp index's), the buffers (verify_buffers.py); with ``frozen`` (the frozen
    parameters' values before the step), each frozen weight this rank holds (:func:`frozen_differences`), gathered
    like the rest: a pipeline rank other than 0 once kept its frozen weights' changes to itself."""
    floor = FLOOR * _norm(ref_grads.values())
    local = [Difference("loss", abs(loss - ref_loss), abs(ref_loss), max_abs_diff=abs(loss - ref_loss))]
    for name, grad in gathered_grads(trainer).items():
        ref = ref_grads.get(name)
        if ref is None and not grad.any():  # no gradient in the reference, zeros in a flat buffer (ZeRO-1's)
            continue
        if ref is None or ref.shape != grad.shape:
            local.append(Difference(f"{name} (missing or mis-shaped in the reference)", math.inf, 0.0))
            continue
        local.append(tensor_difference(name=name, grad=grad, ref=ref.cpu(), floor=floor))
    if ref_updated is not None and initial is not None:
        noise = tolerance_of(trainer.plan).noise
        local += _weight_differences(
            trainer,
            initial=initial,
            ref_updated=ref_updated,
            ref_grads=ref_grads,
            floor=floor,
            noise=noise,
            weights=weights,
        )
    if ref_buffers is not None:
        local += buffer_differences(trainer.stage_modules.values(), ref_buffers, original_name)
    if frozen is not None and weights is not None:
        local += frozen_differences(weights=weights, initial=frozen)
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


def _wide(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` in double precision, complex128 where it is complex (``.double()`` drops an imaginary part)."""
    return tensor.to(torch.complex128) if tensor.is_complex() else tensor.double()


def _norm(tensors) -> float:
    return math.sqrt(sum(float(_wide(t).abs().pow(2).sum()) for t in tensors))


def _weight_differences(
    trainer: Trainer,
    *,
    initial: dict,
    ref_updated: dict,
    ref_grads: dict,
    floor: float,
    noise: float,
    weights: dict | None = None,
) -> list[Difference]:
    """Updated weights against the reference step, relative to the reference update (module
    docstring). Adam turns a gradient of pure rounding noise into a full-size step of random
    sign, so tensors whose reference gradient is below the floor are not judged, and inside a
    tensor neither are the elements whose reference gradient is within the compute dtype's
    rounding band of its largest (``noise`` = the gradient tolerance: the key third of a fused
    qkv bias, whose gradient is mathematically zero, when experts sum their rows in another
    grouping). A missing all-gather or a wrong learning rate still moves every other element."""
    update_floor = FLOOR * _norm(ref_updated[n] - initial[n] for n in ref_updated)
    found = []
    weights = weights if weights is not None else gathered_weights(trainer)
    for name, weight in weights.items():
        if name not in ref_updated or float(_wide(ref_grads[name]).norm()) <= floor:
            continue
        grad = _wide(ref_grads[name].cpu()).abs()
        signal = grad > noise * float(grad.max())
        ref = _wide(ref_updated[name].cpu())[signal]
        step = float((ref - _wide(initial[name].cpu())[signal]).norm())
        diff = _wide(weight)[signal] - ref
        found.append(
            Difference(
                f"{name} {UPDATED}",
                float(diff.norm()),
                step,
                update_floor,
                float(diff.abs().max()) if diff.numel() else 0.0,
            )
        )
    return found


def tensor_difference(*, name: str, grad: torch.Tensor, ref: torch.Tensor, floor: float) -> Difference:
    """The norm-relative difference of one gradient (module docstring)."""
    diff = _wide(grad) - _wide(ref)
    return Difference(
        name, float(diff.norm()), float(_wide(ref).norm()), floor, float(diff.abs().max()) if diff.numel() else 0.0
    )


@dataclass(frozen=True)
class Tolerance:
    """What --verify allows a plan (module docstring): on gradients and the loss, on updated
    weights relative to the reference update, the rounding band left out of the update check
    (``noise``), and which dtype set them, in words."""

    gradient: float
    update: float
    noise: float
    source: str

    def of(self, name: str) -> float:
        return self.update if name.endswith(UPDATED) else self.gradient


def tolerance_of(plan: Plan) -> Tolerance:
    """The tolerance of a plan: that of the coarser of its compute precision and, when gradients
    are reduced (dp > 1), its ``grad_reduce_dtype``: an fp32 plan that sums its gradients in bf16
    rounds each of them to bf16 (a relative 2^-9), so it is judged as bf16 is. Expert parallelism in
    a 16-bit precision widens the gradient tolerance by ``REGROUPED_FACTOR`` (module docstring)."""
    coarsest = plan.precision
    if plan.dp > 1 and TOLERANCE.get(plan.grad_reduce_dtype, 0.0) > TOLERANCE[coarsest]:
        coarsest = plan.grad_reduce_dtype
    source = plan.precision if coarsest == plan.precision else f"{coarsest}: gradients are reduced in {coarsest}"
    regrouped = plan.ep > 1 and coarsest != "fp32"
    return Tolerance(
        gradient=TOLERANCE[coarsest] * (REGROUPED_FACTOR if regrouped else 1.0),
        update=UPDATE_TOLERANCE[coarsest],
        noise=TOLERANCE[coarsest],
        source=source + (f", experts regrouped over ep={plan.ep}" if regrouped else ""),
    )


def step_table(
    *, diffs: list[Difference], plan: Plan, step: int | None = None, rows: int = 8
) -> tuple[bool, list[str]]:
    """(passed, a short table of the ``rows`` largest differences) of one compared step."""
    tol = tolerance_of(plan)
    at = f"step {step}, " if step is not None else ""
    lines = [
        f"verify ({at}{tol.source}, tolerance {tol.gradient:g} on ||diff|| / ||reference|| for gradients, "
        f"{tol.update:g} of the reference update for weights after the step): {len(diffs)} tensors compared"
    ]
    # nearest their own tolerance first: a gradient at 1.02x its 3e-2 fails where a weight at 0.07x its 0.5 does not,
    # and ranking by the relative difference alone listed the weights and left the failing gradient out
    for diff in sorted(diffs, key=lambda d: d.relative / tol.of(d.name), reverse=True)[:rows]:
        lines.append(
            f"  {diff.name:<50s} rel={diff.relative:.3e} (tolerance {tol.of(diff.name):g})  "
            f"||diff||={diff.error_norm:.3e}  ||ref||={diff.ref_norm:.3e}  max|diff|={diff.max_abs_diff:.3e}"
        )
    return all(d.relative <= tol.of(d.name) for d in diffs), lines


def verdict(*, diffs: list[Difference], plan: Plan) -> tuple[bool, str]:
    """(passed, the table of one compared step and ``verify: PASSED`` or ``verify: FAILED``)."""
    passed, lines = step_table(diffs=diffs, plan=plan)
    return passed, "\n".join([*lines, "verify: PASSED" if passed else "verify: FAILED"])


def _dense(grad: torch.Tensor) -> torch.Tensor:
    """A sparse embedding gradient (rows as read, duplicates summed) as the dense tensor the run steps with."""
    return grad.coalesce().to_dense() if grad.is_sparse else grad
