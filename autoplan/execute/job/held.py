"""What a rank holds, for the execution audit (execute/job/audit.py): the tensors alive as a step starts, which
the live-bytes meter counts from the step's first op (execute/job/meters.py ``LiveBytes``), and the parameter and
optimizer-state bytes it places (the audit's "parameters held" row)."""

from __future__ import annotations

from typing import Any

import torch

from autoplan.execute.job.meters import local_tensor
from autoplan.execute.job.receive_buffers import receive_slots


def existing_tensors(trainer: Any) -> list[torch.Tensor]:
    """What a rank holds as a step starts: weights, grads, buffers, optimizer and hooks' states, receive slots."""
    found = receive_slots(getattr(trainer, "schedule", None))
    for module in trainer.stage_modules.values():
        found += [p for p in module.parameters()] + [b for b in module.buffers()]
        found += [p.grad for p in module.parameters() if p.grad is not None]
        hook = getattr(module, "powersgd_state", None)
        for held in (hook.error_dict, hook.p_memory_dict, hook.q_memory_dict) if hook is not None else ():
            found += list(held.values())
        found += getattr(module, "topk_state", None).held_tensors() if hasattr(module, "topk_state") else []
    for state in optimizer_states(trainer.optimizer):
        found += [v for v in state.values() if isinstance(v, torch.Tensor)]
    return found + _held(trainer.optimizer) + _held(getattr(trainer, "outer", None))


def _held(optimizer: Any) -> list[torch.Tensor]:
    """Tensors an optimizer keeps besides its states (ZeRO-1's fp32 master slice; DiLoCo's anchor and momentum)."""
    return list(getattr(optimizer, "held_tensors", lambda: [])())


def optimizer_states(optimizer: Any) -> list[dict]:
    inner = None if getattr(optimizer, "on_host", False) else getattr(optimizer, "inner", optimizer)  # offload.py
    return list(inner.state.values()) if inner is not None and hasattr(inner, "state") else []


def placement(trainer: Any) -> dict[str, int]:
    """Bytes of parameters and optimizer states this rank holds, and its parameter elements."""
    params = [local_tensor(p) for p in trainer.parameters]
    held = [v for s in optimizer_states(trainer.optimizer) for v in s.values() if isinstance(v, torch.Tensor)]
    states = [local_tensor(t) for t in held if t.dim() > 0] + [local_tensor(t) for t in _held(trainer.optimizer)]
    return {
        "param_elements": sum(p.numel() for p in params),
        "weights_bytes": sum(p.numel() * p.element_size() for p in params),
        "optimizer_bytes": sum(t.numel() * t.element_size() for t in states),
    }
