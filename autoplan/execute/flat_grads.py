"""The gradients of ZeRO-1 and of the explicit all-reduce accumulated in one flat fp32 buffer, as
Megatron-LM accumulates into ``param.main_grad`` views of its grad buffer
(megatron/core/distributed/param_and_grad_buffer.py), and reduced from it in place.

The buffer holds the local parameters end to end, padded to ``numel`` (ZeRO-1: N' = dp ceil(N / dp)).
A step starts with every ``.grad`` unset. The first micro-batch's backward makes each gradient as
autograd does; a post-accumulate-grad hook copies it into its view of the buffer and makes the view
the parameter's ``.grad``, so every later micro-batch's ``AccumulateGrad`` adds into the view in place
(the accumulation pass autoplan/cost/dp/accumulation.py prices). The reduction then reads the buffer:

    before: per step, a flat copy (zero fill and one copy of every gradient: 4 P + 8 P bytes for P
            fp32 gradients, and a copy back after the all-reduce, 8 P), and rP more memory;
    now:    the first micro-batch's copy into the buffer (8 P), no flat copy, reduced in place.

Only plain fp32 parameters get views (:func:`holds_flat_grads`: the executor's fp32 weights under
autocast, tp = 1; types/plan.py ``flat_grads`` tells the cost model). A gradient the step left
elsewhere (a tied weight's summed copy, one no micro-batch reached) is brought into its view by
:meth:`FlatGrads.collect`.
"""

from __future__ import annotations

import torch
import torch.nn as nn
from torch.distributed.tensor import DTensor


def holds_flat_grads(params: list[nn.Parameter]) -> bool:
    """Whether every parameter can take a view of a flat fp32 buffer as its gradient: plain tensors
    (a DTensor's gradient must be a DTensor of its placements), all fp32 (autograd keeps a gradient
    in its parameter's dtype), on one device."""
    return (
        bool(params)
        and all(not isinstance(p, DTensor) and p.dtype == torch.float32 for p in params)
        and len({p.device for p in params}) == 1
    )


class FlatGrads:
    """One flat fp32 buffer into which ``params``' gradients accumulate (module docstring)."""

    def __init__(self, *, params: list[nn.Parameter], numel: int):
        self.params = params
        self.buffer = torch.zeros(numel, dtype=torch.float32, device=params[0].device)
        self.views, offset = [], 0
        for param in params:
            view = self.buffer[offset : offset + param.numel()].view_as(param)
            self.views.append(view)
            param.register_post_accumulate_grad_hook(lambda p, v=view: _into_view(p, v))
            offset += param.numel()
        self.used = offset

    def collect(self) -> torch.Tensor:
        """The buffer, holding every gradient: one that is not its view copied in, zeros where unset."""
        for param, view in zip(self.params, self.views):
            grad = param.grad
            if grad is None:
                view.zero_()
            elif not _is_view(grad, view):
                view.copy_(grad)
        self.buffer[self.used :].zero_()  # the padding (an all-gather into the buffer may have written it)
        return self.buffer

    def set_gradients(self, *, had: list[bool]) -> None:
        """Make each view the gradient of its parameter where ``had`` says the step gave it one (after
        :meth:`collect`); the others stay unset, as the step left them, so that AdamW skips them."""
        for param, view, kept in zip(self.params, self.views, had):
            param.grad = view if kept else None


def _into_view(param: nn.Parameter, view: torch.Tensor) -> None:
    """After autograd set or added ``param``'s gradient: a fresh one (the step's first) is copied
    into ``view``, which becomes the gradient the next micro-batches add into."""
    if param.grad is not None and not _is_view(param.grad, view):
        view.copy_(param.grad)
        param.grad = view


def _is_view(grad: torch.Tensor, view: torch.Tensor) -> bool:
    return grad.data_ptr() == view.data_ptr() and grad.shape == view.shape and grad.stride() == view.stride()


def allreduce_buffer(*, dense: list[nn.Parameter], some_unused: bool) -> FlatGrads | None:
    """The explicit all-reduce's buffer over the dense parameters (experts sync by their own rule);
    None where they cannot take views, or where a parameter may go unused in a step: its gradient
    must then stay unset, as one device leaves it, so that AdamW skips it."""
    if some_unused or not holds_flat_grads(dense):
        return None
    return FlatGrads(params=dense, numel=sum(p.numel() for p in dense))
