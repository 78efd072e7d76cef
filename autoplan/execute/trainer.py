"""One training step (forward, loss, backward, gradient sync, optimizer step) for every plan.

``train_step(inputs, target)`` takes this dp rank's share of the global batch
(``micro_batch_size * num_microbatches`` samples; :meth:`Trainer.local_batch` cuts it from a
global batch). Without a pipeline it accumulates gradients over the micro-batches, syncing
data-parallel gradients only after the last; with one, the schedule runs the micro-batches
and computes the loss on the last stage, in ``schedule_steps`` k schedule steps of m / k each
(types/schedule_steps.py; torch's FSDP2 reduce-scatter after each, the explicit all-reduce once
after all). It returns the mean micro-batch loss on ranks that hold the last stage and NaN
elsewhere; :meth:`Trainer.reduce_loss` gives every rank the global loss (a collective, kept out
of the step so it is not timed). Under context parallelism the target is this cp rank's sequence
shard (the blocks shard their inputs and route attention to the cp group:
autoplan/execute/context_parallel.py), and gradients average over dp x cp.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor.experimental import implicit_replication

from autoplan.errors import PlanError
from autoplan.execute import precision
from autoplan.execute.batch import move_to, shard_batch, slice_batch
from autoplan.execute.cp_loss import token_weights
from autoplan.execute.data_parallel import allreduce_grads
from autoplan.execute.expert_parallel import split_params
from autoplan.execute.labels import chunk_label
from autoplan.execute.pipeline_args import is_bound_value, stage_inputs
from autoplan.execute.sparse_grads import densify_grads, release_grads
from autoplan.execute.tensor_parallel import finalize_tp_grads
from autoplan.types.plan import Plan

DTENSOR_LIMITS = ("unevenly sharded", "does not have a sharding strategy", "Cannot unflatten")


@contextlib.contextmanager
def _explained(plan: Plan, context: Any = None):
    """Turn DTensor's refusal of a model op under the plan's splits, or a model that context
    parallelism's sequence shards cannot run (``context``, context_parallel.py), into a PlanError."""
    try:
        yield
    except (RuntimeError, NotImplementedError) as exc:
        refused = context.refusal(exc) if context is not None else None
        if refused is not None:
            raise refused from exc
        text = str(exc)
        if "cached during selective activation checkpoint has been mutated" in text:
            raise PlanError(
                "selective recomputation keeps the outputs of matmuls, and the model changes one in place (an "
                "in-place op such as F.relu(x, inplace=True) or x.add_(...) on a matmul's output inside a block), "
                "which torch's checkpoint refuses; make that op out of place, or plan recompute=full or none."
            ) from exc
        if plan.tp > 1 and any(marker in text for marker in DTENSOR_LIMITS):
            first = text.strip().splitlines()[0]
            raise PlanError(
                f"the model's code cannot run under this tp_plan ({first}); mark the Linear whose output it reshapes "
                "'replicate' or use another tp degree (docs/executor.md)."
            ) from exc
        raise


@dataclass
class Trainer:
    plan: Plan
    mesh: DeviceMesh
    stage_modules: dict[int, nn.Module]
    optimizer: Any
    loss_fn: Callable[[Any, Any], torch.Tensor]
    device: torch.device
    dp_mode: str
    policy: precision.PrecisionPolicy
    schedule: Any = None
    scaler: Any = None  # a ShardedGradScaler for fp16 (grad_scaler.py)
    target_given: bool = True
    tie_sync: Any = None
    aliases: dict[str, str] | None = None
    last_loss_scale: float = 1.0  # the fp16 loss scale the last step back-propagated with
    last_step_skipped: bool = False  # fp16: the last step overflowed somewhere and was skipped
    experts: Any = None  # an ExpertParallel under expert parallelism (expert_parallel.py)
    # some parameters may get no gradient in a step (loop-written experts no token reached): their
    # gradients are set to None, as one device's zero_grad() leaves them, so AdamW skips them
    some_unused: bool = False
    unscaled_losses: list = field(default_factory=list)  # (returned, unscaled) per loss call on the last stage
    grad_mesh: Any = None  # the ranks averaging gradients: dp, or dp x cp (mesh.py grad_mesh)
    context: Any = None  # a ContextParallel at cp > 1 (context_parallel.py)
    flat_grads: Any = None  # the explicit all-reduce's FlatGrads: gradients as views of one buffer (flat_grads.py)
    activation_offload: Any = None  # an ActivationOffload under offload_activations (activation_offload.py)
    outer: Any = None  # local SGD / DiLoCo's OuterSync, run after the optimizer step (local_sgd.py)
    densified: list = field(default_factory=list)  # sparse gradients made dense for the last step (sparse_grads.py)
    heartbeat: Any = (
        None  # the rank's Heartbeat (autoplan/jobs/heartbeat.py): phases marked per micro-batch, not per op
    )
    traced: bool = False  # label each micro-batch's forward and backward for torch.profiler (labels.py)
    whole_target: Any = None  # a pipeline step's target that is no tensor (a dict): its rows go by index
    # a pipeline's parameters no stage holds (the graph never reads them), by FQN: saved as built (checkpoint/state.py)
    unheld: dict = field(default_factory=dict)
    token_weights: Any = None  # cp: each micro-batch's loss weight where targets skip tokens (local_batch)

    def mark(self, phase: str, *, kind: str = "compute") -> None:
        """Tell the heartbeat which phase of the step this rank is in (one tuple stored)."""
        if self.heartbeat is not None:
            self.heartbeat.mark(phase, kind=kind)

    def schedule_loss(self, output: Any, target: Any) -> torch.Tensor:
        """The loss the pipeline schedule calls per micro-batch on the last stage (scaled for
        fp16: the schedule runs backward on what this returns). The unscaled loss is kept for
        :meth:`_pipelined` to report: a 16-bit loss times the scale can overflow where the loss
        does not (the scaler then skips the step), and a reported inf would read as a diverged run."""
        target = self._target_rows(target)
        loss = self._weighed(self.loss_fn(output, target if self.target_given else None), target)
        steps = self.plan.schedule_steps  # k > 1: the mean over the optimizer step's m (execute/pipeline.py)
        mean = loss / self.plan.num_microbatches if steps > 1 else loss
        scaled = self.scaler.scale_loss(mean) if self.scaler else mean
        self.unscaled_losses.append((scaled, loss.detach().float()))
        return scaled

    # ---- what callers see ---------------------------------------------------------------
    @property
    def model(self) -> nn.Module:
        """The sharded model (pp=1), or this rank's only stage module (pp>1)."""
        if len(self.stage_modules) == 1:
            return next(iter(self.stage_modules.values()))
        return nn.ModuleDict({str(i): m for i, m in self.stage_modules.items()})

    @property
    def parameters(self) -> list[nn.Parameter]:
        return [p for m in self.stage_modules.values() for p in m.parameters()]

    @property
    def trainable(self) -> list[nn.Parameter]:
        """The parameters that take gradients (frozen ones, ``requires_grad=False``, are held only)."""
        return [p for p in self.parameters if p.requires_grad]

    @property
    def holds_last_stage(self) -> bool:
        return len(self.plan.stages or [[]]) - 1 in self.stage_modules or self.plan.pp == 1

    @property
    def holds_first_stage(self) -> bool:
        return 0 in self.stage_modules

    def local_batch(self, inputs: tuple, target: Any) -> tuple[tuple, Any]:
        """This dp rank's share of a global batch, on this rank's device, and under context
        parallelism the target's sequence shard (the model's inputs run whole up to the blocks)."""
        global_batch = self.plan.global_batch_size
        index, parts = self.mesh.get_local_rank("dp"), self.plan.dp
        inputs = shard_batch(tuple(inputs), index=index, parts=parts, batch_size=global_batch)
        target = shard_batch(target, index=index, parts=parts, batch_size=global_batch)
        if self.context is not None:
            whole, target = target, move_to(self.context.shard_target(target, batch=global_batch // parts), self.device)
            self.token_weights = token_weights(whole, target, rows=self.plan.micro_batch_size, cp=self.plan.cp)
        return move_to(inputs, self.device), move_to(target, self.device)

    def _weighed(self, loss: torch.Tensor, target: Any) -> torch.Tensor:
        """``loss`` times its micro-batch's weight under cp where targets skip tokens (TokenWeights)."""
        return loss if self.token_weights is None else loss * self.token_weights.of(target)

    # ---- the step -----------------------------------------------------------------------
    def train_step(self, inputs: tuple, target: Any) -> torch.Tensor:
        # Under DDP the gradients are views of its buckets (gradient_as_bucket_view): zero them in
        # place, so the micro-batches before the synced one accumulate there too, instead of into
        # fresh tensors that would live beside the buckets (a second gradient-sized copy). Where a
        # parameter may go unused, None: DDP leaves a globally unused one's gradient untouched, so it
        # stays None and AdamW skips it (a zeroed one would still take a momentum step).
        release_grads(self.densified)
        self.optimizer.zero_grad(set_to_none=self.dp_mode != "ddp" or self.some_unused)
        # DTensor must accept plain tensors (masks, rotary tables, grads of them) as
        # replicated values, in forward and in backward.
        replicate = implicit_replication() if self.plan.tp > 1 else contextlib.nullcontext()
        with replicate, _explained(self.plan, self.context):
            loss = (
                self._pipelined(tuple(inputs), target)
                if self.schedule is not None
                else self._accumulated(tuple(inputs), target)
            )
            self.mark("gradient sync", kind="collective")
            self._sync_grads()
        self.mark("optimizer step")
        self._optimizer_step()
        if self.outer is not None:  # after the inner step, on the weights it wrote
            self.mark("outer sync", kind="collective")
            self.weights_ready()
            self.outer.after_step()
        return loss

    def _forward_context(self):
        return precision.autocast(self.policy, device_type=self.device.type)

    def _accumulated(self, inputs: tuple, target: Any) -> torch.Tensor:
        n = self.plan.num_microbatches
        batch = self.plan.micro_batch_size * n
        model = self.model
        total = torch.zeros((), device=self.device)
        for index in range(n):
            last = index == n - 1
            x = shard_batch(inputs, index=index, parts=n, batch_size=batch)
            y = shard_batch(target, index=index, parts=n, batch_size=batch)
            self.mark(f"forward mb{index}")
            with (
                self._grad_sync(model, enabled=last),
                self._forward_context(),
                chunk_label(self.traced, "forward", index),
            ):
                loss = self._weighed(self.loss_fn(model(*x), y), y) / n
            self.mark(f"backward mb{index}")
            with chunk_label(self.traced, "backward", index):
                (self.scaler.scale_loss(loss) if self.scaler else loss).backward()
            total += loss.detach().float()
        return total

    def _grad_sync(self, model: nn.Module, *, enabled: bool):
        """DDP: skip the gradient all-reduce on all but the last micro-batch. FSDP2 (ZeRO-2/3):
        reduce-scatter every micro-batch, so gradients stay partitioned (Rajbhandari et al.
        SC'20 section 5.2); under ZeRO-2 the weights also stay gathered until the last
        micro-batch's backward (one all-gather per step), as the cost model prices."""
        if self.dp_mode == "ddp" and not enabled:
            return model.no_sync()
        if self.dp_mode == "fsdp" and self.plan.zero_stage == 2:
            model.set_reshard_after_backward(enabled)
        return contextlib.nullcontext()

    def _pipelined(self, inputs: tuple, target: Any) -> torch.Tensor:
        losses: list[torch.Tensor] = []
        batch = self.plan.micro_batch_size * self.plan.num_microbatches
        self.target_given = target is not None
        if target is None:  # the schedule splits a target per micro-batch; give it one to split
            target = torch.zeros(batch, device=self.device)
        self.unscaled_losses.clear()
        self.mark(f"pipeline schedule (chunks {', '.join(map(str, sorted(self.stage_modules)))})")
        k = self.plan.schedule_steps  # k schedule steps of m / k micro-batches each (types/schedule_steps.py)
        for step in range(k):
            found: list[torch.Tensor] = []
            kwargs = {"target": self._schedule_target(shard_batch(target, index=step, parts=k, batch_size=batch)),
                      "losses": found}  # fmt: skip
            args = shard_batch(inputs, index=step, parts=k, batch_size=batch) if self.holds_first_stage else ()
            args = self._stage_args(args)
            with self._forward_context():  # the losses are all we use; merging logits costs a copy
                self.schedule.step(*args, return_outputs=False, **(kwargs if self.holds_last_stage else {}))
            losses += found
        # The schedule's own losses, unscaled; torch's first step also calls the loss on its shape-
        # inference pass (on uninitialised tensors), which is left out by identity.
        kept = [unscaled for scaled, unscaled in self.unscaled_losses if any(scaled is loss for loss in losses)]
        self.unscaled_losses.clear()
        if not kept:
            return torch.tensor(float("nan"), device=self.device)
        return torch.stack(kept).mean()

    def _schedule_target(self, target: Any) -> torch.Tensor:
        """What the schedule splits into micro-batches as the target: the target itself when it is a tensor, else the
        rows' indices, which :meth:`_target_rows` turns back into the rows of the kept target (torch's schedule splits
        only tensors: a dict of targets stopped every pipeline plan)."""
        self.whole_target = None if isinstance(target, torch.Tensor) else target
        if self.whole_target is None:
            return target
        return torch.arange(self.plan.micro_batch_size * self.plan.num_microbatches // self.plan.schedule_steps,
                            device=self.device)  # fmt: skip

    def _target_rows(self, target: Any) -> Any:
        """The micro-batch's target: the schedule's split, or the rows its indices name (:meth:`_schedule_target`);
        rows 0.. where they name none (torch's shape-inference call of the loss, on uninitialised tensors)."""
        if self.whole_target is None or not isinstance(target, torch.Tensor) or target.dim() != 1 or not len(target):
            return target
        rows = self.plan.micro_batch_size * self.plan.num_microbatches // self.plan.schedule_steps
        start = int(target[0])
        start = start if 0 <= start <= rows - len(target) else 0
        return slice_batch(self.whole_target, start=start, stop=start + len(target), batch_size=rows)

    def _stage_args(self, args: tuple) -> tuple:
        """The tensor arguments, which the first stage receives: the split fixed the others at the values the
        plan recorded (execute/pipeline_args.py ``values_bound``), so a different value is refused, not ignored."""
        specs = self.plan.inputs if len(self.plan.inputs) == len(args) else []
        for i, (arg, spec) in enumerate(zip(args, specs)):
            if is_bound_value(arg) and spec.kind == "value" and arg != spec.value:
                raise PlanError(
                    f"forward() argument {i} is {arg!r}, but the pipeline stages were split with it fixed at "
                    f"{spec.value!r}, the value the plan was traced with; plan again with this value."
                )
        return stage_inputs(args)

    def _sync_grads(self) -> None:
        params = self.trainable
        if self.dp_mode == "ddp" and not self.some_unused:
            _refuse_unreached(self.model, params)
        if self.plan.tp > 1:
            finalize_tp_grads(params)
        if self.tie_sync is not None:
            self.tie_sync()
        if self.experts is not None:  # their own rule: summed over edp, divided by dp
            self.experts.sync_grads(dp_mode=self.dp_mode, reduce_dtype=self.policy.reduce_dtype)
        if self.dp_mode == "allreduce":
            dense, _ = split_params(params, self.experts)
            allreduce_grads(
                params=dense, dp_mesh=self._grad_mesh(), reduce_dtype=self.policy.reduce_dtype, flat=self.flat_grads
            )

    def _grad_mesh(self) -> DeviceMesh:
        return self.mesh["dp"] if self.grad_mesh is None else self.grad_mesh

    def _optimizer_step(self) -> None:
        """Step (fp16: unscale first, and skip on every rank when any gradient overflowed); synced sparse
        gradients are made dense first (sparse_grads.py)."""
        self.densified = densify_grads(self.trainable)
        _lay_out_as_params(self.trainable)
        if self.scaler is None:
            self.optimizer.step()
            return
        self.last_loss_scale = self.scaler.scale
        found_inf = self.scaler.unscale_(self.trainable)
        self.last_step_skipped = found_inf
        if not found_inf:
            self.optimizer.step()
        self.scaler.update(found_inf)

    def sync_next(self) -> None:
        """Local SGD / DiLoCo: make the next step an outer-sync step (the execution audit's); nothing otherwise."""
        if self.outer is not None:
            self.outer.sync_next()

    def weights_ready(self) -> None:
        """Finish ZeRO-1's all-gathers left for the next forward (``overlap_param_gather``,
        execute/param_gather.py): call before reading the weights outside a forward."""
        wait = getattr(self.optimizer, "wait_gathers", None)
        if wait is not None:
            wait()

    def reduce_loss(self, loss: torch.Tensor) -> float:
        """The global mean loss on every rank (averaged over the ranks holding the last stage: a cp
        rank's loss is its sequence shard's mean)."""
        holders = self.plan.dp * self.plan.cp * self.plan.tp
        value = (
            loss.detach().float().reshape(1).clone() if self.holds_last_stage else torch.zeros(1, device=self.device)
        )
        dist.all_reduce(value)
        return float(value.item()) / holders


def _lay_out_as_params(params: list[nn.Parameter]) -> None:
    """Give each gradient its parameter's strides: AdamW's fused kernel pairs weight and gradient elements by memory
    order, and a split backward's W hands a weight autograd's gradient as it is, channels-last for a convolution
    reading a channels-last activation (ConvNeXt), which AccumulateGrad would have laid out as the weight."""
    for param in params:
        grad = param.grad
        if grad is not None and not grad.is_sparse and grad.stride() != param.stride():
            param.grad = torch.empty_like(param, dtype=grad.dtype).copy_(grad)


def _refuse_unreached(model: nn.Module, trainable: list[nn.Parameter]) -> None:
    """DDP (no ``find_unused_parameters``) waits for every trainable parameter's gradient and stopped the next step
    with torch's long message where one never gets any: read only under ``torch.no_grad()``, or never. One sentence
    instead, naming them, after the first backward; FSDP2 and ZeRO-1 reduce zeros for them."""
    if not any(p.grad is None for p in trainable):
        return
    held = {id(p) for p in trainable if p.grad is None}
    names = [name.removeprefix("module.") for name, p in model.named_parameters() if id(p) in held]
    shown = ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
    verb = "gets" if len(names) == 1 else "get"
    raise PlanError(
        f"{shown} {verb} no gradient (read only under torch.no_grad(), or never), and DDP waits for every trainable "
        "parameter's: freeze them (requires_grad_(False)) in build_model(), or run a plan with --fix zero=1."
    )
