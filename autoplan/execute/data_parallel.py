"""Data parallelism realising the plan's ZeRO stage (docs/executor.md, "Data parallelism and ZeRO"
and "Gradient reduction dtype and PowerSGD").

| zero | no pipeline, tp=1 | otherwise (pipeline stage or tp>1) |
|------|-------------------|------------------------------------|
| 0    | DDP (explicit all-reduce when ``overlap_grad_reduce`` is false) | explicit gradient all-reduce |
| 1    | :class:`~autoplan.execute.zero.ShardedOptimizer`: reduce-scatter, sharded step, all-gather | same |
| 2    | FSDP2 ``fully_shard(reshard_after_forward=False)``: params gathered forward to backward | same |
| 3    | FSDP2 ``fully_shard(reshard_after_forward=True)``: params resharded after forward | same |

Gradients travel in ``plan.grad_reduce_dtype`` (DDP's compress hook, a cast of the flat buffer,
FSDP2's ``reduce_dtype``). PowerSGD (DDP only; Vogels et al., NeurIPS 2019) is torch's
``powerSGD_hook``: each gradient as an ``n x m`` matrix ``M`` with ``r = min(n, m, powersgd_rank)``
is compressed only when ``2 (n + m) r < n m`` (the rule autoplan/cost/dp/compression.py prices), with
error feedback ``e`` and a warm-started ``Q``:

    M += e;  P = M Q, all-reduce P, orthogonalise P;  Q = M^T P, all-reduce Q, / dp;  M' = P Q^T;  e = M - M'

The first ``POWERSGD_START_ITER`` = 2 steps all-reduce uncompressed. FSDP2 wraps each block, then
the root; experts modules first, on the edp mesh (autoplan/execute/expert_parallel.py). Top-k
sparsification with error feedback (DDP only) is autoplan/execute/topk_hook.py.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import PowerSGDState, powerSGD_hook
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel

from autoplan.execute.flat_grads import FlatGrads
from autoplan.execute.topk_hook import TopKState, topk_hook
from autoplan.types.grad_compression import POWERSGD_START_ITER
from autoplan.types.plan import Plan, runs_ddp

#: torch's default: compress a matrix only when (n + m) r times this is below n m
POWERSGD_MIN_COMPRESSION_RATE = 2


def dp_mode(*, plan: Plan) -> str:
    """'none', 'ddp', 'allreduce', 'zero1' or 'fsdp' for this plan, over its dp x cp ranks."""
    if plan.dp * plan.cp == 1:
        return "none"
    if plan.zero_stage >= 2:
        return "fsdp"
    if plan.zero_stage == 1:
        return "zero1"
    if runs_ddp(
        dp=plan.dp * plan.cp,  # the ranks that sync gradients (mesh.py grad_mesh)
        tp=plan.tp,
        pp=plan.pp,
        zero_stage=plan.zero_stage,
        overlap_grad_reduce=plan.overlap_grad_reduce,
    ):
        return "ddp"
    return "allreduce"


def apply_fsdp(
    *,
    module: nn.Module,
    blocks: list[str],
    plan: Plan,
    dp_mesh: DeviceMesh,
    mp_policy: MixedPrecisionPolicy | None,
    experts: Sequence[nn.Module] = (),
    edp_mesh: DeviceMesh | None = None,
) -> nn.Module:
    """fully_shard each experts module on the edp mesh, then each block present in ``module``,
    then ``module`` itself; a 0-dim parameter (CLIP's ``logit_scale``), which fully_shard refuses, and a complex one
    (a global filter's spectrum: fully_shard wants one dtype per group, "FSDP expects uniform original parameter
    dtype") are left out of every group, replicated, and their gradients averaged over the dp ranks
    (:func:`_averaged_over`)."""
    kwargs = {"mesh": dp_mesh, "reshard_after_forward": plan.zero_stage == 3}
    if (
        plan.offload == "full"
    ):  # every shard, its gradient and its Adam step on the host (docs/cost-model.md, "Offload")
        kwargs["offload_policy"] = CPUOffloadPolicy(pin_memory=torch.cuda.is_available())
    if mp_policy is not None:
        kwargs["mp_policy"] = mp_policy
    for expert_module in experts:
        policy = dataclasses.replace(mp_policy or MixedPrecisionPolicy(), cast_forward_inputs=False)
        fully_shard(expert_module, **{**kwargs, "mesh": edp_mesh, "mp_policy": policy})
    if apart := {p for p in module.parameters() if p.dim() == 0 or p.is_complex()}:
        kwargs["ignored_params"] = apart
        _averaged_over(apart, dp_mesh)
    present = dict(module.named_modules())
    inner_first = sorted(blocks, key=lambda b: -b.count("."))  # inner before outer, as fully_shard needs
    units = [unit for fqn in inner_first if fqn in present for unit in _callable_units(present[fqn])]
    for unit in _apart(units):
        fully_shard(unit, **kwargs)
    fully_shard(module, **kwargs)
    return module


def _averaged_over(params: set[nn.Parameter], dp_mesh: DeviceMesh) -> None:
    """Each of ``params`` (0-dim or complex: left out of fully_shard's groups and replicated)
    averages its gradient over the dp ranks as each micro-batch's backward accumulates it: the accumulated
    gradient is equal on every rank, so averaging again after the next micro-batch adds that one's mean."""
    groups = [dp_mesh.get_group(dim) for dim in range(dp_mesh.ndim)]

    def average(param: nn.Parameter) -> None:
        for group in groups:
            dist.all_reduce(param.grad, group=group)
        param.grad.div_(dp_mesh.size())

    for param in params:
        param.register_post_accumulate_grad_hook(average)


def _apart(units: list[nn.Module]) -> list[nn.Module]:
    """The units that share no parameter with another: fully_shard refuses a parameter another group manages, and a
    weight tied across two units (a masked-LM decoder's to the embedding, where the blocks are top-level modules)
    stopped the run. Units that share one are left to the enclosing module's group, which gathers them together."""
    owners: dict[int, int] = {}
    for unit in units:
        for param in unit.parameters():
            owners[id(param)] = owners.get(id(param), 0) + 1
    return [unit for unit in units if all(owners[id(p)] == 1 for p in unit.parameters())]


def _callable_units(block: nn.Module) -> list[nn.Module]:
    """``block``, or where it is a container without a forward() (a ModuleList of one block, which the tracer takes
    as a top-level module: fully_shard refuses it), its children holding parameters: the same parameters, gathered
    as each runs."""
    if type(block).forward is not nn.Module.forward:
        return [block]
    units = [unit for child in block.children() for unit in _callable_units(child)]
    return [unit for unit in units if any(True for _ in unit.parameters())]


def apply_ddp(
    *,
    module: nn.Module,
    dp_mesh: DeviceMesh,
    device: torch.device,
    reduce_dtype: torch.dtype,
    ignore: frozenset[int] = frozenset(),
    powersgd_rank: int = 0,
    find_unused: bool = False,
    topk_ratio: float = 0.0,
) -> nn.Module:
    """Wrap ``module`` in DDP over the dp group; gradients are the bucket views (no second
    copy), buffers are broadcast only when the module has some, and the all-reduce runs in
    ``reduce_dtype``, or, with ``powersgd_rank`` > 0, through torch's PowerSGD hook at that
    rank (module docstring), or, with ``topk_ratio`` > 0, through autoplan's top-k hook with error
    feedback (execute/topk_hook.py). Parameters in ``ignore`` (by id: sliced experts) are left alone.
    ``find_unused``: some parameters may get no gradient on a rank (an expert of a loop-written
    MoE layer that got no rows, autoplan/execute/expert_loop.py); DDP then reduces zeros for
    them, and leaves the gradient of one that no rank used unset, as one device would."""
    if ignore:
        names = [name for name, p in module.named_parameters() if id(p) in ignore]
        DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(module, names)
    device_ids = [device.index] if device.type == "cuda" else None
    ddp = DistributedDataParallel(
        module,
        process_group=dp_mesh.get_group(),
        device_ids=device_ids,
        gradient_as_bucket_view=True,
        forward_sync_buffers=any(True for _ in module.buffers()),
        find_unused_parameters=find_unused,
    )
    if powersgd_rank > 0:
        assert reduce_dtype == torch.float32, "the Plan allows PowerSGD with fp32 reduction only"
        ddp.powersgd_state = powersgd_state(group=dp_mesh.get_group(), rank=powersgd_rank)
        in_order = dist.get_backend(dp_mesh.get_group()) == "gloo"
        ddp.register_comm_hook(ddp.powersgd_state, bucket_at_a_time(powerSGD_hook) if in_order else powerSGD_hook)
    elif topk_ratio > 0:
        assert reduce_dtype == torch.float32, "the Plan allows top-k with fp32 reduction only"
        ddp.topk_state = TopKState(group=dp_mesh.get_group(), ratio=topk_ratio)
        ddp.register_comm_hook(ddp.topk_state, topk_hook)
    elif reduce_dtype != torch.float32:
        ddp.register_comm_hook(dp_mesh.get_group(), low_precision_hook(reduce_dtype))
    return ddp


def bucket_at_a_time(hook):
    """``hook`` with each bucket finished before the hook returns. torch's PowerSGD hook issues
    its second and third all-reduces (P, Q) from future callbacks; under gloo those run on its
    worker threads, so with two buckets in flight ranks can issue them in different orders (a
    collective mismatch, seen as soon as DDP makes a second bucket). Waiting serialises the
    buckets; on a CPU the backward and the reduction share the cores anyway."""

    def serial(state, bucket):
        done = hook(state, bucket).wait()
        future = torch.futures.Future()
        future.set_result(done)
        return future

    return serial


def powersgd_state(*, group: dist.ProcessGroup, rank: int) -> PowerSGDState:
    """torch's PowerSGD state at ``rank`` with error feedback and warm start, compressing from
    step ``POWERSGD_START_ITER`` on, a matrix only when that pays ``POWERSGD_MIN_COMPRESSION_RATE``."""
    return PowerSGDState(
        process_group=group,
        matrix_approximation_rank=rank,
        start_powerSGD_iter=POWERSGD_START_ITER,
        min_compression_rate=POWERSGD_MIN_COMPRESSION_RATE,
        use_error_feedback=True,
        warm_start=True,
    )


def low_precision_hook(dtype: torch.dtype):
    """A DDP comm hook that all-reduces the bucket's mean in ``dtype`` and copies it back
    (torch's ``bf16_compress_hook`` does the same, but only on CUDA with NCCL). DDP checks a
    hook's annotations by identity, which postponed annotations break, hence none here."""

    def hook(group, bucket):
        buffer = bucket.buffer()
        low = buffer.to(dtype).div_(group.size())
        future = dist.all_reduce(low, group=group, async_op=True).get_future()
        return future.then(lambda done: buffer.copy_(done.value()[0]))

    return hook


def local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def allreduce_grads(
    *,
    params: list[nn.Parameter],
    dp_mesh: DeviceMesh,
    reduce_dtype: torch.dtype = torch.float32,
    flat: FlatGrads | None = None,
) -> None:
    """Average every gradient over the dp group, sent in ``reduce_dtype``: in place on ``flat``'s
    buffer where the gradients are its views (execute/flat_grads.py), else one flat copy per dtype."""
    group = dp_mesh.get_group()
    if flat is not None:
        had = [param.grad is not None for param in flat.params]
        buffer = flat.collect()
        mean = _allreduce_mean(buffer, group=group, reduce_dtype=reduce_dtype)
        if mean is not buffer:
            buffer.copy_(mean)
        flat.set_gradients(had=had)
        return
    by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
    for param in params:
        if param.grad is not None:
            grad = local(param.grad)
            by_dtype.setdefault(grad.dtype, []).append(grad)
    for grads in by_dtype.values():
        reduced = _allreduce_mean(torch.cat([g.reshape(-1) for g in grads]), group=group, reduce_dtype=reduce_dtype)
        offset = 0
        for g in grads:
            g.copy_(reduced[offset : offset + g.numel()].view_as(g))
            offset += g.numel()


def _allreduce_mean(flat: torch.Tensor, *, group: dist.ProcessGroup, reduce_dtype: torch.dtype) -> torch.Tensor:
    """``flat``'s mean over ``group``, summed in ``reduce_dtype``: ``flat`` itself, reduced in place,
    when that is its dtype, else a cast of it (NCCL averages itself; gloo sums and this divides)."""
    sent = flat.to(reduce_dtype)
    op = dist.ReduceOp.AVG if dist.get_backend(group) == "nccl" else dist.ReduceOp.SUM
    dist.all_reduce(sent, op=op, group=group)
    if op == dist.ReduceOp.SUM:
        sent /= dist.get_world_size(group)
    return sent
