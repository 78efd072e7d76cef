"""A trainer's state in one plan-independent form: what a checkpoint saves and loads
(docs/elastic.md, "Checkpoints").

Every tensor is keyed by its FQN in the original model, whatever the plan did to it (wrappers
dropped, stages keep FQNs, a tied alias maps to its first name: verify.py ``original_name``), and
is a global tensor: a TP- or FSDP2-sharded parameter its DTensor, an expert slice ``[E / ep, ...]``
a DTensor ``Shard(0)`` over the ep group, anything else a plain tensor. Keys: ``model.<fqn>``,
``optim.<fqn>.<state>``, ``extra.loss_scale`` (fp16), top-k's ``extra.topk.rank<r>.<fqn>`` (residual.py),
each dp index's buffers ``extra.buffers.dp<d>.<fqn>`` (buffers.py) and ``rng.rank<r>.cpu`` / ``.cuda``. DCP
saves each shard once and loads whatever slice each destination covers, so a checkpoint written
by one plan loads into any other plan of the same model.

ZeRO-1's flat fp32 slices (autoplan/execute/zero.py) are all-gathered over dp and cut per
parameter by :func:`trainer_state`, and scattered back by :meth:`TrainerState.write_back`; a fresh
torch optimizer first gets its state from one step with zero gradients and a zero learning rate.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.tensor import DTensor, Shard

from autoplan.execute.checkpoint.buffers import buffer_state
from autoplan.execute.checkpoint.outer import outer_state
from autoplan.execute.checkpoint.residual import residual_state
from autoplan.execute.data_parallel import local
from autoplan.execute.trainer import Trainer

MODEL, OPTIM, EXTRA, RNG = "model.", "optim.", "extra.", "rng."


@dataclass
class TrainerState:
    """The state dictionary DCP saves or loads in place, and what to do after a load."""

    tensors: dict[str, Any]
    after_load: list[Callable[[], None]] = field(default_factory=list)

    def write_back(self) -> None:
        """Copy loaded values where the trainer keeps them (ZeRO-1's flat slices, the loss scale)."""
        for step in self.after_load:
            step()


def named_state(trainer: Trainer) -> dict[str, torch.Tensor]:
    """This rank's parameters and persistent buffers by original FQN (first holder of a name)."""
    from autoplan.execute.job.verify import original_name

    aliases = trainer.aliases or {}
    found: dict[str, torch.Tensor] = {}
    for module in trainer.stage_modules.values():
        persistent = {original_name(k) for k in module.state_dict().keys()}
        for name, param in module.named_parameters():
            found.setdefault(aliases.get(original_name(name), original_name(name)), param)
        for name, buffer in module.named_buffers():
            if original_name(name) in persistent:
                found.setdefault(original_name(name), buffer)
    return found


def global_view(trainer: Trainer, name: str, tensor: torch.Tensor, state: TrainerState) -> torch.Tensor:
    """``tensor`` (a parameter, or a state shaped like it) as a global tensor: sharing its storage,
    except for an expert that FSDP2 also sharded over edp, whose ``[E / ep, ...]`` slice is gathered
    (and written back into this rank's edp shard after a load)."""
    tensor = tensor.detach()
    experts = trainer.experts
    if experts is None or name not in experts.names:
        return tensor
    if isinstance(tensor, DTensor) and experts.folded(tensor):
        return tensor  # folded over tp: already the DTensor of the whole tensor on the ep (x etp) mesh
    if isinstance(tensor, DTensor):  # FSDP2's Shard(0) over edp, of this ep rank's slice
        whole = tensor.full_tensor()
        state.after_load.append(_copy_edp_shard(whole, tensor, experts.edp_mesh))
        tensor = whole
    return DTensor.from_local(tensor, experts.ep_mesh, [Shard(0)], run_check=False)


def _copy_edp_shard(whole: torch.Tensor, sharded: DTensor, edp_mesh: Any) -> Callable[[], None]:
    """After a load: this rank's FSDP2 shard (torch.chunk over edp) of the loaded ``[E / ep, ...]`` slice."""

    @torch.no_grad()
    def write() -> None:
        mine = whole.chunk(edp_mesh.size())[edp_mesh.get_local_rank()]
        sharded.to_local().copy_(mine)

    return write


def trainer_state(trainer: Trainer, *, for_load: bool = False) -> TrainerState:
    """The trainer's state as DCP saves it (module docstring); ``for_load``: create a fresh
    optimizer's state first, so there is somewhere to load it."""
    trainer.weights_ready()
    named = named_state(trainer)
    state = TrainerState({})
    state.tensors.update({MODEL + name: global_view(trainer, name, t, state) for name, t in named.items()})
    params = {name: t for name, t in named.items() if isinstance(t, nn.Parameter) or t.requires_grad}
    # a pipeline's parameters no stage holds, as built: the checkpoint holds every parameter of the model
    state.tensors.update({MODEL + name: t.detach() for name, t in trainer.unheld.items() if name not in named})
    if hasattr(trainer.optimizer, "reduced_gradients"):  # ZeRO-1 (one or two sharded optimizers)
        _zero1_state(trainer, params, state, for_load=for_load)
    else:
        if for_load:
            create_optimizer_state(trainer.optimizer, list(params.values()))
        _optimizer_state(trainer, params, state)
    outer_state(trainer, params, state, for_load=for_load)  # local SGD / DiLoCo (checkpoint/outer.py)
    if trainer.scaler is not None:
        _scaler_state(trainer, state)
    residual_state(trainer, params, state.tensors, state.after_load, for_load=for_load)  # top-k's, per rank
    buffer_state(trainer, state.tensors, state.after_load, for_load=for_load)  # each dp index's (buffers.py)
    _rng_state(state)
    return state


def _optimizer_state(trainer: Trainer, params: dict[str, torch.Tensor], state: TrainerState) -> None:
    for name, param in params.items():
        for key, value in trainer.optimizer.state.get(param, {}).items():
            if isinstance(value, torch.Tensor):
                value = value if value.dim() == 0 else global_view(trainer, name, value, state)
                state.tensors[f"{OPTIM}{name}.{key}"] = value


@torch.no_grad()
def create_optimizer_state(optimizer: Any, params: list[torch.Tensor]) -> None:
    """One step with zero gradients at lr = 0 (module docstring), where some parameter has no state."""
    if all(optimizer.state.get(p) for p in params):
        return
    saved = [group["lr"] for group in optimizer.param_groups]
    grads = [p.grad for p in params]
    for param in params:
        param.grad = torch.zeros_like(param)
    for group in optimizer.param_groups:
        group["lr"] = 0.0 if not isinstance(group["lr"], torch.Tensor) else group["lr"].zero_()
    try:
        optimizer.step()
    finally:
        for group, lr in zip(optimizer.param_groups, saved):
            group["lr"] = lr
        for param, grad in zip(params, grads):
            param.grad = grad


def _zero1_state(trainer: Trainer, params: dict[str, torch.Tensor], state: TrainerState, *, for_load: bool) -> None:
    """Per-parameter views of ZeRO-1's flat slices, all-gathered over dp; write_back scatters
    loaded values into the slices (module docstring)."""
    names = {id(p): name for name, p in params.items()}
    parts = getattr(trainer.optimizer, "parts", [trainer.optimizer])
    for part in parts:
        if for_load:
            create_optimizer_state(part.inner, [part.master])
        inner = part.inner.state.get(part.master) or {}
        keys = [k for k, v in inner.items() if isinstance(v, torch.Tensor) and v.dim() == 1]
        for key in keys:
            flat = inner.get(key, torch.zeros_like(part.master))
            views = part.per_parameter(part.gather(flat))
            for param, view in zip(part.params, views):
                state.tensors[f"{OPTIM}{names[id(param)]}.{key}"] = global_view(trainer, names[id(param)], view, state)
            state.after_load.append(_scatter_back(part, key, views))
        step = inner.get("step", torch.zeros((), dtype=torch.float32, device=part.master.device))
        step = step.detach().clone()
        for param in part.params:
            state.tensors[f"{OPTIM}{names[id(param)]}.step"] = step
        state.after_load.append(_restore_master(part, step))


def _scatter_back(part: Any, key: str, views: list[torch.Tensor]) -> Callable[[], None]:
    def write() -> None:
        mine = part.my_slice(part._flat([local(v) for v in views], torch.float32))
        inner = part.inner.state.setdefault(part.master, {})
        if key in inner:
            inner[key].copy_(mine)
        else:
            inner[key] = mine.clone()

    return write


def _restore_master(part: Any, step: torch.Tensor) -> Callable[[], None]:
    """The fp32 master slice from the loaded parameters, and the optimizer's step count."""

    @torch.no_grad()
    def write() -> None:
        part.master.data.copy_(part.my_slice(part._flat([local(p.data) for p in part.params], torch.float32)))
        inner = part.inner.state.setdefault(part.master, {})
        inner["step"] = step.detach().clone().to(inner["step"].device) if "step" in inner else step.clone()

    return write


def _scaler_state(trainer: Trainer, state: TrainerState) -> None:
    scaler = trainer.scaler
    value = torch.tensor([scaler.scale, float(scaler.clean_steps), float(scaler.skipped_steps)], dtype=torch.float64)
    state.tensors[EXTRA + "loss_scale"] = value

    def write() -> None:
        scaler.scale, clean, skipped = (float(v) for v in value.tolist())
        scaler.clean_steps, scaler.skipped_steps = int(clean), int(skipped)

    state.after_load.append(write)


def _rng_state(state: TrainerState) -> None:
    """This rank's RNG states (restored only when the world size is unchanged, store.load_state)."""
    rank = dist.get_rank() if dist.is_initialized() else 0
    cpu = torch.get_rng_state()
    state.tensors[f"{RNG}rank{rank}.cpu"] = cpu
    state.after_load.append(lambda: torch.set_rng_state(cpu))
    if torch.cuda.is_available():
        cuda = torch.cuda.get_rng_state()
        state.tensors[f"{RNG}rank{rank}.cuda"] = cuda
        state.after_load.append(lambda: torch.cuda.set_rng_state(cuda))
