"""``parallelize(model, plan, ...)``: build everything a plan says, in a fixed order (each step's
"after X, before Y" in full: docs/executor.md, "Composition order").

0. **Device rules**: a plan this machine cannot run (async TP, FP8) is refused before anything is built.
1. **Pipeline split** first: torch.export must see the plain eager model; experts modules are one
   opaque op each (execute/expert_dispatch.py). **FP8** linears right after it, before every wrapper.
2. **Expert parallelism**: after the split (a stage slices its own experts), before data
   parallelism, which must see the sliced parameters (execute/expert_parallel.py).
2b. **Context parallelism**'s pre-hooks on the blocks before the pipeline split, whose export traces
   them into the stages, so every stage computes on the sequence shard (execute/context_parallel.py).
3. **Tensor parallelism** (+SP, the tp mesh's RNG tracker): on the stage modules that run, before
   recomputation so a checkpointed block replays its redistributions.
4. **Activation recomputation**, then **torch.compile** per block (``plan.compile``, or async TP's),
   before FSDP, so FSDP's all-gather hooks stay outside the checkpointed, compiled forward
   (torchtitan's TP -> AC -> compile -> FSDP; execute/compiled.py).
5. **FSDP2 / DDP / explicit all-reduce** last among module transforms: they must see the final
   (DTensor, sliced) parameters. Their group is dp x cp (the ranks holding the same weights).
6. **Schedule** last: ``PipelineStage`` needs the finished stage modules.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
import torch.nn as nn
from torch.utils._pytree import tree_leaves

from autoplan.errors import PlanError
from autoplan.execute import (
    data_parallel,
    expert_loop,
    expert_parallel,
    expert_sequence,
    float8,
    pipeline,
    precision,
    rng,
    sparse_grads,
)
from autoplan.execute.activation_offload import ActivationOffload, apply_activation_offload
from autoplan.execute.compiled import compile_blocks
from autoplan.execute.context_parallel import build_context_parallel
from autoplan.execute.flat_grads import allreduce_buffer
from autoplan.execute.grad_scaler import ShardedGradScaler
from autoplan.execute.local_sgd import OuterSync, inner_mesh, outer_group
from autoplan.execute.materialize import materialize
from autoplan.execute.mesh import build_mesh, coordinates, expert_mesh, grad_mesh, local_device
from autoplan.execute.offload import OffloadedOptimizer, OneRank
from autoplan.execute.param_gather import overlapped_zero1
from autoplan.execute.pipeline_scatter import apply_pipeline_scatter, boundary_specs
from autoplan.execute.recompute import apply_recompute, expects_recompute, out_of_place, recompute_targets
from autoplan.execute.tensor_parallel import apply_tensor_parallel, validate_tp_plan
from autoplan.execute.tied import TiedGradSync, build_tied_sync, tied_names
from autoplan.execute.tp_overlap import apply_async_tp, check_runs_here
from autoplan.execute.trainer import Trainer
from autoplan.execute.unreached import unreached_params
from autoplan.execute.zero import sharded_optimizer
from autoplan.trace.build import seq_len_of
from autoplan.trace.identity import check_plan_is_for_module
from autoplan.trace.layers import find_blocks
from autoplan.types.activation_offload import offloaded_blocks
from autoplan.types.local_sgd import is_local_sgd
from autoplan.types.plan import Plan
from autoplan.types.runtime import check_runs_on_autoplan
from autoplan.types.schedules import SPLIT_BACKWARD, v_shaped


def default_optimizer(params: list[nn.Parameter]) -> torch.optim.Optimizer:
    """AdamW with its fused kernel: one pass over weight, gradient and both moments (the
    28 bytes per parameter the cost model charges, autoplan/cost/model.py), where the
    for-loop and foreach versions make a pass per arithmetic step. The fused kernel takes floating parameters only:
    a model with a complex one (a global filter's spectrum) gets torch's default AdamW, which takes both."""
    tensors = [t for p in params for t in (p["params"] if isinstance(p, dict) else [p])]  # tensors, or param groups
    fused = all(torch.is_floating_point(t) for t in tensors)
    return torch.optim.AdamW(params, lr=1e-4, fused=fused or None)


def parallelize(
    model: nn.Module,
    plan: Plan,
    *,
    loss_fn: Callable[[Any, Any], torch.Tensor],
    microbatch_inputs: tuple | None = None,
    microbatch_target: Any = None,
    device: torch.device | None = None,
    optimizer_fn: Callable[[list[nn.Parameter]], Any] = default_optimizer,
) -> Trainer:
    """Parallelize ``model`` as ``plan`` says; return the :class:`Trainer`.

    Call inside an initialised process group of ``plan.devices`` ranks, with the same model
    (same seed) on every rank. ``microbatch_inputs`` (forward args for ``micro_batch_size``
    samples) export and split the model when ``plan.pp > 1``; without them they are built from
    the inputs the plan was traced with (``plan.inputs``: shapes and dtypes), so a plan from
    ``autoplan.plan(model, inputs, ...)`` needs none. A plan without ``inputs`` (made from a
    graph traced before they were recorded, or from inputs that are not tensors and scalars)
    still needs them. ``microbatch_target`` (the loss's target for those samples) lets DDP tell a parameter the
    loss never reaches (execute/unreached.py)."""
    check_runs_on_autoplan(plan.runtime)
    check_runs_here(plan)
    check_plan_is_for_module(plan, model)
    if microbatch_inputs is None and plan.inputs and (plan.pp > 1 or plan.cp > 1 or (plan.tp > 1 and not plan.tp_plan)):
        from autoplan.execute.batch import microbatch_from_specs

        microbatch_inputs = microbatch_from_specs(plan.inputs, micro_batch_size=plan.micro_batch_size)
    device = device or local_device()
    model = materialize(model, device=device)  # built on meta: initialise it (same RNG state on every rank)
    plan = with_default_tp_plan(model=model, plan=plan, microbatch_inputs=microbatch_inputs)
    kinds = validate_tp_plan(model=model, plan=plan)
    experts = expert_parallel.find_experts(model)
    expert_parallel.check_expert_parallel(model=model, plan=plan, dispatches=experts)
    list_moe = expert_loop.list_layers(model)
    moe_blocks = expert_sequence.moe_blocks(list(experts))
    expert_sequence.check_unsplit(plan=plan, blocks=moe_blocks)
    fp8_linears = float8.eligible_fqns(model, plan, exclude=tuple(experts) + list_moe)
    sparse_grads.check_runs_here(model, plan)  # before any group or module transform
    mesh = build_mesh(plan=plan)
    sync_mesh = grad_mesh(mesh=mesh, plan=plan)
    outer = outer_group(plan=plan, mesh=mesh, sync_mesh=sync_mesh) if is_local_sgd(plan) else None
    inner = inner_mesh(plan=plan, sync_mesh=sync_mesh)  # local SGD: no gradient sync over the replicas
    ep_mesh = expert_mesh(mesh=mesh, plan=plan)
    model = model.to(device)
    blocks = [b for stage in plan.stages for b in stage] or find_blocks(
        model
    )  # the tracer's rule (autoplan/trace/layers.py)
    targets = recompute_targets(plan=plan, blocks=blocks)  # all, or the first k of each chunk (recompute.py)
    if plan.recompute == "selective":  # before the split, which bakes a module's in-place flag into its graph
        out_of_place(module=model, blocks=targets)
    cp_state = build_context_parallel(plan=plan, mesh=mesh, seq_len=seq_len_of(tuple(microbatch_inputs or ())))
    if cp_state is not None:
        cp_state.install(model=model, blocks=blocks)
    ties = tied_names(model)
    aliases = {alias: names[0] for names in ties for alias in names[1:]}
    modules, tie_sync, out_spec, sends, unheld = _split(
        model=model,
        plan=plan,
        microbatch_inputs=microbatch_inputs,
        mesh=mesh,
        ties=ties,
        device=device,
        experts=experts,
    )
    # FP8 linears before expert, tensor and data parallelism, which must see them (float8.py).
    for module in modules.values():
        float8.convert_linears(module, fp8_linears, recipe=plan.fp8_recipe_used, fsdp_gather=float8.fsdp_gather(plan))
    ep_state = expert_parallel.apply_expert_parallel(
        modules=modules, plan=plan, dispatches=experts, expert_mesh=ep_mesh, eager=plan.pp == 1
    )
    mode = data_parallel.dp_mode(plan=plan) if plan.sync_every == 1 or plan.dp_replicate > 1 else "none"
    policy = precision.policy_for(precision=plan.precision, dp_mode=mode, reduce_dtype=plan.grad_reduce_dtype)
    unused = bool(list_moe) or (
        mode == "ddp" and _finds_unreached(model, policy, device, microbatch_inputs, microbatch_target, loss_fn)
    )
    checkpointed, offload = 0, ActivationOffload() if plan.offload_activations else None
    if plan.tp > 1:  # dropout masks: equal on replicated activations, independent per shard (rng.py)
        rng.install_tracker(mesh["tp"])
    for index, module in modules.items():
        apply_tensor_parallel(
            module=module, plan=plan, tp_mesh=mesh["tp"], kinds=kinds, moe=(*experts, *list_moe, *moe_blocks)
        )
        # after TP, whose DTensors the sends are cut from and the receives rebuilt as (pipeline_scatter.py)
        apply_pipeline_scatter(
            module=module,
            plan=plan,
            tp_mesh=mesh["tp"],
            received=sends[index - 1] if index > 0 else None,
            sent=sends[index] if index < len(sends) else None,
        )
        expert_loop.install(module=module, plan=plan, layers=list_moe, touch=plan.dp > 1 and mode != "ddp")
        if plan.tp > 1 and plan.sequence_parallel:  # on the DTensor parameters TP made, inside what recompute wraps
            expert_sequence.apply_sequence_parallel_experts(
                modules={index: module}, blocks=moe_blocks, tp_mesh=mesh["tp"]
            )
        if cp_state is not None:  # after the split and TP, before recompute (context_parallel.py)
            cp_state.route_attention(module=module, blocks=blocks)
        checkpointed += apply_recompute(
            module=module, blocks=targets, mode=plan.recompute, split_backward=plan.schedule in SPLIT_BACKWARD
        )
        if offload is not None:  # the blocks recompute does not wrap (types/activation_offload.py), before FSDP
            kept = offloaded_blocks(recomputed=targets, blocks=blocks)
            apply_activation_offload(module=module, blocks=kept, offload=offload)
        if plan.tp_comm_overlap:  # async TP compiles the blocks itself (tp_overlap.py)
            apply_async_tp(module=module, blocks=blocks, tp_mesh=mesh["tp"])
        elif plan.compile:  # after TP and recompute, before FSDP/DDP (module docstring, step 4)
            compile_blocks(module=module, blocks=blocks)
        modules[index] = _data_parallel(
            module=module,
            blocks=blocks,
            plan=plan,
            dp_mesh=inner,
            mode=mode,
            device=device,
            policy=policy,
            ep=ep_state,
            find_unused=unused,
        )
    if expects_recompute(plan=plan, targets=targets, chunks=list(modules)) and not checkpointed:
        raise PlanError(
            f"plan recompute='{plan.recompute}' but this rank holds none of the blocks it applies to "
            f"({', '.join(blocks[:3]) or 'the model has no blocks'}); "
            "plan recompute='none' or list the blocks in 'stages'."
        )
    # the optimizer, ZeRO-1's flat buffers and the all-reduce's see the trainable parameters only:
    # a frozen one (requires_grad=False) gets no gradient, no state and no sync (docs/executor.md)
    params = [p for m in modules.values() for p in m.parameters() if p.requires_grad]
    optimizer = _optimizer(
        plan=plan, mode=mode, params=params, modules=list(modules.values()), blocks=blocks, optimizer_fn=optimizer_fn,
        dp_mesh=inner, reduce_dtype=policy.reduce_dtype, ep=ep_state,
    )  # fmt: skip
    scaler = ShardedGradScaler(device=device) if policy.scales_loss else None
    trainer = Trainer(
        plan=plan,
        mesh=mesh,
        stage_modules=modules,
        optimizer=optimizer,
        loss_fn=loss_fn,
        device=device,
        dp_mode=mode,
        policy=policy,
        scaler=scaler,
        tie_sync=tie_sync,
        aliases=aliases,
        unheld=unheld,
        experts=ep_state,
        some_unused=unused,
        grad_mesh=sync_mesh,
        context=cp_state,
        activation_offload=offload,
        outer=OuterSync(plan=plan, params=params, group=outer) if outer is not None else None,
        flat_grads=allreduce_buffer(dense=expert_parallel.split_params(params, ep_state)[0], some_unused=bool(list_moe))
        if mode == "allreduce"
        else None,
    )
    if plan.pp > 1:
        trainer.schedule = pipeline.build_schedule(
            stage_modules=modules,
            plan=plan,
            pp_mesh=mesh["pp"],
            device=device,
            loss_fn=trainer.schedule_loss,
            out_spec=out_spec,
            lanes=ep_state.dispatches[0].lanes if ep_state is not None and ep_state.dispatches else None,
        )
    return trainer


def _optimizer(
    *, plan: Plan, mode: str, params: list, modules: list, blocks: list[str], optimizer_fn: Callable, **zero: Any
) -> Any:
    """The plan's optimizer: ZeRO-1's sharded one (its all-gather per block under the next forward
    with ``overlap_param_gather``: execute/param_gather.py), else ``optimizer_fn`` on every parameter. A rank
    that holds no trainable parameter (a pipeline stage of frozen layers) gets ``optimizer_fn`` on one empty
    parameter group, whose step does nothing: torch's optimizers refuse an empty parameter list."""
    if not params:  # the same on every dp rank of the stage: no ZeRO state to shard
        return optimizer_fn([{"params": []}])
    if plan.offload == "optimizer" and mode == "none":  # ZeRO-Offload on one dp rank (execute/offload.py OneRank)
        return OffloadedOptimizer(
            params=params, optimizer_fn=optimizer_fn, dp_mesh=OneRank(), reduce_dtype=zero["reduce_dtype"]
        )
    if mode != "zero1":
        return optimizer_fn(params)
    if plan.offload == "optimizer":  # ZeRO-Offload: the master slice steps on the host (execute/offload.py)
        return OffloadedOptimizer(
            params=params, optimizer_fn=optimizer_fn, dp_mesh=zero["dp_mesh"], reduce_dtype=zero["reduce_dtype"]
        )
    if plan.overlap_param_gather:
        kept = {k: v for k, v in zero.items() if k != "ep"}  # refused with experts (tp_overlap.check_runs_here)
        return overlapped_zero1(modules=modules, blocks=blocks, optimizer_fn=optimizer_fn, **kept)
    return sharded_optimizer(params=params, optimizer_fn=optimizer_fn, **zero)


def _split(
    *,
    model: nn.Module,
    plan: Plan,
    microbatch_inputs: tuple | None,
    mesh: Any,
    ties: list[list[str]],
    device: torch.device,
    experts: dict[str, expert_parallel.ExpertsDispatch],
) -> tuple[dict[int, nn.Module], TiedGradSync | None, Any, list, dict]:
    """This rank's stage modules, the tied-weight gradient sync, the spec that rebuilds the
    model's output from the last stage's tensors (``pipeline.split_model``), and what each chunk
    but the last sends the next (``pipeline_scatter.boundary_specs``), and the parameters no stage holds."""
    if plan.pp == 1:
        return {0: model}, None, None, [], {}
    if microbatch_inputs is None:
        raise PlanError(
            f"plan pp={plan.pp} needs microbatch_inputs (forward args for {plan.micro_batch_size} samples) "
            "to split the model into stages, and the plan records no traced inputs to build them from "
            "(re-plan it with this version of autoplan, or pass microbatch_inputs)."
        )
    from autoplan.execute.batch import move_to

    pipe, out_spec = pipeline.split_model(
        model=model, plan=plan, microbatch_args=move_to(tuple(microbatch_inputs), device), experts=experts
    )
    modules = {i: pipe.get_stage_module(i) for i in pipeline.stage_indices(plan=plan, pp_rank=coordinates(mesh)["pp"])}
    holders = {
        i: {n for n, _ in pipe.get_stage_module(i).named_parameters(remove_duplicate=False)}
        for i in range(pipe.num_stages)
    }
    held = set().union(*holders.values(), *(names[1:] for names in ties))
    unheld = {n: p for n, p in model.named_parameters() if n not in held}  # the graph reads them nowhere
    # Groups are created on every rank before any module transform (new_group is a collective).
    sends = boundary_specs([pipe.get_stage_module(i) for i in range(pipe.num_stages)], tree_leaves(microbatch_inputs))
    tie_sync = build_tied_sync(
        groups=ties, holders=holders, pp=plan.pp, v_shape=v_shaped(plan.schedule), mesh=mesh, my_modules=modules
    )
    return modules, tie_sync, out_spec, sends, unheld


def _data_parallel(
    *,
    module: nn.Module,
    blocks: list[str],
    plan: Plan,
    dp_mesh: Any,
    mode: str,
    device: torch.device,
    policy: precision.PrecisionPolicy,
    ep: expert_parallel.ExpertParallel | None,
    find_unused: bool = False,
) -> nn.Module:
    """Data parallelism on one stage module; its expert parameters (``ep``) on the edp mesh
    (FSDP2) or left out of DDP, which the Trainer's gradient sync then reduces. ``find_unused``:
    DDP looks for parameters without a gradient (experts of loop-written MoE layers)."""
    experts = [layer.module for layer in ep.layers if any(m is layer.module for m in module.modules())] if ep else []
    if mode == "fsdp":
        return data_parallel.apply_fsdp(
            module=module,
            blocks=blocks,
            plan=plan,
            dp_mesh=dp_mesh,
            mp_policy=precision.mp_policy(policy),
            experts=experts,
            edp_mesh=ep.edp_mesh if ep else None,
        )
    if mode == "ddp":
        return data_parallel.apply_ddp(
            module=module,
            dp_mesh=dp_mesh,
            device=device,
            reduce_dtype=policy.reduce_dtype,
            ignore=frozenset(id(p) for m in experts for p in m.parameters()),
            powersgd_rank=plan.powersgd_rank if plan.grad_compression == "powersgd" else 0,
            find_unused=find_unused,
            topk_ratio=plan.topk_ratio,
        )
    return module


def _finds_unreached(
    model: nn.Module,
    policy: precision.PrecisionPolicy,
    device: torch.device,
    inputs: tuple | None,
    target: Any,
    loss_fn: Callable[[Any, Any], torch.Tensor],
) -> bool:
    """Whether a forward and loss on the micro-batch, under the step's autocast, leave a trainable parameter without
    gradient: DDP then looks for unused parameters (execute/unreached.py)."""
    from autoplan.execute.batch import move_to

    if inputs is None:
        return False
    found = unreached_params(
        model,
        move_to(tuple(inputs), device),
        loss_fn=loss_fn,
        target=move_to(target, device),
        context=lambda: precision.autocast(policy, device_type=device.type),
    )
    return bool(found)


def with_default_tp_plan(*, model: nn.Module, plan: Plan, microbatch_inputs: tuple | None) -> Plan:
    """``plan`` itself, or, at tp > 1 with an empty ``tp_plan``, the plan with the Megatron
    default the cost model prices for it (``cost.tp.default.default_tp_plan`` on a trace of
    ``model``), so that what runs is what was priced."""
    if plan.tp == 1 or plan.tp_plan:
        return plan
    if microbatch_inputs is None:
        raise PlanError(
            f"plan tp={plan.tp} has an empty tp_plan; pass microbatch_inputs so the executor can trace the model "
            "and apply the default split the cost model priced, or give the plan a tp_plan."
        )
    import dataclasses

    from autoplan.cost.tp.default import default_tp_plan
    from autoplan.trace import trace

    graph = trace(model, tuple(microbatch_inputs), routing=plan.routing)
    return dataclasses.replace(plan, tp_plan=default_tp_plan(graph, plan.tp, sequence_parallel=plan.sequence_parallel))
