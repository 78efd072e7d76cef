"""Local SGD / DiLoCo's state in a checkpoint (execute/local_sgd.py; docs/elastic.md, "Checkpoints").

Keys, beside the model's and the inner optimizer's: ``extra.outer.<fqn>.anchor`` and
``extra.outer.<fqn>.momentum_buffer`` (DiLoCo's anchor and Nesterov momentum, global tensors as the
parameter is: a DTensor over the parameter's mesh where it is one) and ``extra.outer_steps`` (the inner steps
counted, so the syncs keep their cadence). The anchor and momentum are the same on every replica; the
parameters between syncs are not, and a checkpoint holds one replica's (DCP writes a replicated tensor once),
so a resume at a multiple of H is exact and one elsewhere restarts every replica from that replica. A
checkpoint without the keys (a synchronous run's) leaves the outer step counting from 0 and the anchor at the
loaded weights.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch.distributed.tensor import DTensor

EXTRA = "extra."


def outer_state(trainer: Any, params: dict[str, torch.Tensor], state: Any, *, for_load: bool) -> None:
    """Add the outer sync's tensors to ``state`` (module docstring), and after a load write them back."""
    outer = trainer.outer
    if outer is None:
        return
    steps = torch.tensor([outer.steps], dtype=torch.int64)
    state.tensors[f"{EXTRA}outer_steps"] = steps
    state.after_load.append(_restore_steps(outer, steps, state.tensors))
    anchor_keys = []
    for name, param in params.items():
        held = outer.held_for(param)
        if for_load and held and "momentum_buffer" not in held and outer.optimizer is not None:
            held["momentum_buffer"] = outer.momentum_for(held["anchor"])
        for key, tensor in held.items():
            full = f"{EXTRA}outer.{name}.{key}"
            state.tensors[full] = _global(tensor, param, state)
            anchor_keys += [full] if key == "anchor" else []
    state.after_load.append(_rebase_unless_loaded(outer, anchor_keys, state.tensors))


def _global(tensor: torch.Tensor, param: torch.Tensor, state: Any) -> torch.Tensor:
    """``tensor`` (shaped like ``param``'s local tensor) as ``param`` is held: a DTensor on its mesh, copied
    back into ``tensor`` after a load; the tensor itself for a plain parameter."""
    if not isinstance(param, DTensor):
        return tensor
    whole = DTensor.from_local(
        tensor, param.device_mesh, param.placements, run_check=False, shape=param.shape, stride=param.stride()
    )
    state.after_load.append(lambda: tensor.copy_(whole.to_local()))
    return whole


def _restore_steps(outer: Any, steps: torch.Tensor, tensors: dict) -> Callable[[], None]:
    def write() -> None:
        if f"{EXTRA}outer_steps" in tensors:  # a synchronous run's checkpoint has none (checkpoint/manager.py)
            outer.steps = int(steps.item())

    return write


def _rebase_unless_loaded(outer: Any, anchor_keys: list[str], tensors: dict) -> Callable[[], None]:
    def write() -> None:
        if anchor_keys and not all(key in tensors for key in anchor_keys):
            outer.rebase()

    return write
