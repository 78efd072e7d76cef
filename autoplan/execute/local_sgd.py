"""The outer sync of local SGD and DiLoCo (types/local_sgd.py; docs/executor.md, "Local SGD and DiLoCo").

After every ``sync_every`` = H inner steps, each rank averages its local parameter tensors (its FSDP2 shard
or TP slice, else the whole parameter) over the outer group in one flat all-reduce of fp32 values; with
"nesterov" the outer optimizer then steps on the anchor copy with the outer gradient ``anchor - average``
and the parameters take the anchor (DiLoCo, Douillard et al. 2023, Algorithm 1):

    avg = mean_r theta_r;  anchor.grad = anchor - avg;  SGD(lr, momentum, nesterov).step();  theta <- anchor

torch's pieces: the outer step is ``torch.optim.SGD(nesterov=True)`` (``nesterov=False`` at momentum 0,
which torch refuses to combine); the averaging is what ``model_averaging.utils.average_parameters`` does,
written here because that function rebinds ``p.data`` to a slice of its flat buffer, which would cut an
FSDP2 DTensor's local shard off from its parameter; its ``PeriodicModelAverager`` counts steps the same way
(averaging on the first call after its warm-up, so H steps here are ``period=H, warmup_steps=H-1`` there).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn

from autoplan.execute.data_parallel import local
from autoplan.types.plan import Plan


class OuterSync:
    """The outer group's average (and DiLoCo's outer step) every ``plan.sync_every`` steps (module docstring)."""

    def __init__(self, *, plan: Plan, params: list[nn.Parameter], group: dist.ProcessGroup) -> None:
        self.every, self.group, self.params = plan.sync_every, group, params
        self.tensors = [local(p.detach()) for p in params]
        self.steps = 0
        self.synced_last_step = False
        self.measure_drift = False  # --verify's: how far the replicas drifted apart (execute/job/replicas.py)
        self.spread_before = 0.0  # max |theta_r - avg| on this rank at the last sync, when measured
        self.anchors: list[torch.Tensor] = []
        self.optimizer: torch.optim.Optimizer | None = None
        if plan.outer_optimizer == "nesterov":
            self.anchors = [t.detach().clone().float() for t in self.tensors]
            mu = plan.outer_momentum
            # one parameter at a time (foreach=False): Nesterov's d + mu m is then one parameter's temporary, not
            # a second copy of them all (cost/dp/local_sgd.py prices the flat buffer only); syncs are rare
            nesterov = dict(momentum=mu, nesterov=mu > 0, foreach=False)
            self.optimizer = torch.optim.SGD(self.anchors, lr=plan.outer_lr, **nesterov)

    def sync_next(self) -> None:
        """Make the next step an outer-sync step (the execution audit's step: it then sees the outer all-reduce)."""
        self.steps = self.every - 1

    def after_step(self) -> None:
        """Count one inner step; sync when H have passed since the last sync."""
        self.steps += 1
        self.synced_last_step = self.steps % self.every == 0
        if self.synced_last_step:
            self.sync()

    @torch.no_grad()
    def sync(self) -> None:
        """Average over the outer group, then the outer step where there is one (module docstring)."""
        flat = torch.cat([t.reshape(-1).float() for t in self.tensors])
        op = dist.ReduceOp.AVG if dist.get_backend(self.group) == "nccl" else dist.ReduceOp.SUM
        dist.all_reduce(flat, op=op, group=self.group)
        if op == dist.ReduceOp.SUM:
            flat /= dist.get_world_size(self.group)
        averages = [avg.view_as(t) for avg, t in zip(flat.split([t.numel() for t in self.tensors]), self.tensors)]
        if self.measure_drift:
            drifts = [float((t.float() - avg).abs().max()) for t, avg in zip(self.tensors, averages) if t.numel()]
            self.spread_before = max(drifts, default=0.0)
        if self.optimizer is None:
            for tensor, avg in zip(self.tensors, averages):
                tensor.copy_(avg)
            return
        for anchor, avg in zip(self.anchors, averages):  # the outer gradient in the flat buffer: no second copy
            anchor.grad = avg.neg_().add_(anchor)
        self.optimizer.step()
        for tensor, anchor in zip(self.tensors, self.anchors):
            tensor.copy_(anchor)
            anchor.grad = None

    def held_tensors(self) -> list[torch.Tensor]:
        """What the outer sync keeps between syncs: DiLoCo's anchors and momentum buffers (the audit's)."""
        state = self.optimizer.state if self.optimizer else {}
        momenta = [state[a]["momentum_buffer"] for a in self.anchors if "momentum_buffer" in state.get(a, {})]
        return self.anchors + momenta

    def momentum_for(self, anchor: torch.Tensor) -> torch.Tensor:
        """The anchor's Nesterov momentum buffer, created at zero where no outer step made it yet (a zero
        buffer steps as torch's first step does, at dampening 0): somewhere for a checkpoint to load into."""
        held = self.optimizer.state[anchor]
        if "momentum_buffer" not in held:
            held["momentum_buffer"] = torch.zeros_like(anchor)
        return held["momentum_buffer"]

    @torch.no_grad()
    def rebase(self) -> None:
        """The anchors := the parameters (after loading weights without them: execute/checkpoint/outer.py)."""
        for anchor, tensor in zip(self.anchors, self.tensors):
            anchor.copy_(tensor)

    def held_for(self, param: torch.Tensor) -> dict[str, torch.Tensor]:
        """DiLoCo's state of one parameter, shaped like its local tensor: "anchor" and (after the first outer
        step with momentum) "momentum_buffer"; empty for "average" or a parameter this sync does not hold."""
        for held, anchor in zip(self.params, self.anchors):
            if held is param:
                found = {"anchor": anchor}
                momentum = self.optimizer.state.get(anchor, {}).get("momentum_buffer") if self.optimizer else None
                return found | ({"momentum_buffer": momentum} if momentum is not None else {})
        return {}


def outer_group(*, plan: Plan, mesh: Any, sync_mesh: Any) -> dist.ProcessGroup:
    """The replicas' group (types/local_sgd.py): HSDP's replicate axis, else the dp axis."""
    from autoplan.types.hsdp import HSDP_AXES

    if plan.dp_replicate > 1:
        return sync_mesh[HSDP_AXES[0]].get_group()
    return mesh["dp"].get_group()


def inner_mesh(*, plan: Plan, sync_mesh: Any) -> Any:
    """The mesh the gradients still sync over every step: the shard group under HSDP at H > 1, else
    ``sync_mesh`` (at H = 1 the plan is synchronous; at H > 1 without HSDP no rank syncs gradients)."""
    from autoplan.types.hsdp import HSDP_AXES

    if plan.sync_every > 1 and plan.dp_replicate > 1:
        return sync_mesh[HSDP_AXES[1]]
    return sync_mesh
