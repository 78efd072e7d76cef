"""Activation offload (``Plan.offload_activations``; docs/executor.md, "Activation offload").

Each block that does not recompute runs its forward under ``torch.autograd.graph.saved_tensors_hooks``
that move what autograd saves to host memory and bring it back when the backward reads it: the
mechanism of torch's ``save_on_cpu(pin_memory=True)``, with three differences that make what crosses
the link what the cost model prices (autoplan/cost/memory/activation_offload.py):

- parameters and buffers stay where they are (``save_on_cpu`` would copy every weight a matmul saves), and
  so do their casts and views (autocast's low-precision weight copy, which autocast holds anyway);
- the block's own inputs stay on the device: the residual stream at the boundary, which the previous
  block made and the next layer holds anyway, and shared inputs (rotary tables, masks);
- a storage is copied once however many ops save views of it, and copied back once, on the first
  unpack; the device copy lives until autograd frees the last saved tensor that reads it.

Both copies run on the current stream (a plain ``copy_``, non-blocking into pinned memory on CUDA), as
``save_on_cpu`` does: they take the compute stream's time, which the cost model prices as exposed.
Host tensors are made outside the step's dispatch recorders (execute/offload.py ``on_host``), so the
audit's live-bytes meter counts the device side only, also on a CPU rank whose host is its device;
what crosses the link is counted by :class:`ActivationOffload` (``copies``), read by the audit as rows
of dim "host", kinds "act_d2h" and "act_h2d".
"""

from __future__ import annotations

import functools
from collections import Counter
from typing import Any

import torch
import torch.nn as nn
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._pytree import tree_leaves

from autoplan.execute.offload import HOST, host_copies, on_host


class _Offloaded:
    """One storage on the host, and its device copy once the backward asked for it."""

    def __init__(self, storage: torch.UntypedStorage, offload: "ActivationOffload"):
        self.device, self.nbytes, self.offload = storage.device, storage.nbytes(), offload
        with on_host():
            pinned = torch.cuda.is_available()
            self.host = torch.empty(self.nbytes, dtype=torch.uint8, device=HOST, pin_memory=pinned)
            self.host.copy_(_bytes_of(storage), non_blocking=pinned)
        offload.count("act_d2h", self.nbytes)
        self.back: torch.Tensor | None = None

    def restored(self) -> torch.UntypedStorage:
        """The storage on the device: copied up on the first call (counted), reused after."""
        if self.back is None:
            self.back = torch.empty(self.nbytes, dtype=torch.uint8, device=self.device)
            self.back.copy_(self.host, non_blocking=self.host.is_pinned())
            self.offload.count("act_h2d", self.nbytes)
        return self.back.untyped_storage()


def _bytes_of(storage: torch.UntypedStorage) -> torch.Tensor:
    return torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)


class ActivationOffload:
    """The offload hooks of one rank's blocks, and the bytes they moved (module docstring)."""

    def __init__(self) -> None:
        self.copies: Counter = Counter()  # (kind, "count" | "bytes") -> total since built

    def count(self, kind: str, nbytes: int) -> None:
        self.copies[(kind, "count")] += 1
        self.copies[(kind, "bytes")] += nbytes

    def wrap(self, block: nn.Module) -> None:
        """Run ``block``'s forward under the hooks; the forward is replaced on the instance (as
        execute/recompute.py does), so FQNs, FSDP and --verify's name mapping are unchanged."""
        forward = block.forward

        @functools.wraps(forward)
        def run(*args, **kwargs):
            kept = {StorageWeakRef(t.untyped_storage()) for t in tree_leaves((args, kwargs)) if _plain(t)}
            kept |= {StorageWeakRef(t.untyped_storage()) for t in [*block.parameters(), *block.buffers()] if _plain(t)}
            offloaded: dict[StorageWeakRef, _Offloaded] = {}
            with torch.autograd.graph.saved_tensors_hooks(
                functools.partial(self._pack, kept=kept, offloaded=offloaded), _unpack
            ):
                return forward(*args, **kwargs)

        block.forward = run

    def _pack(self, tensor: torch.Tensor, *, kept: set, offloaded: dict) -> Any:
        if not _plain(tensor) or (tensor.device.type == "cpu" and torch.cuda.is_available()):
            return tensor  # already on the host (on a CPU rank the device is the host: offloaded all the same)
        key = StorageWeakRef(tensor.untyped_storage())
        if key in kept or _cast_of_parameter(tensor):
            return tensor
        if key not in offloaded:
            offloaded[key] = _Offloaded(tensor.untyped_storage(), self)
        return (offloaded[key], tensor.storage_offset(), tensor.size(), tensor.stride(), tensor.dtype)


def _unpack(packed: Any) -> torch.Tensor:
    if isinstance(packed, torch.Tensor):
        return packed
    held, offset, size, stride, dtype = packed
    return torch.empty(0, dtype=dtype, device=held.device).set_(held.restored(), offset, size, stride)


#: the autograd nodes of a cast or a view: what lies between a parameter and autocast's copy of it (``w.t()``)
CAST_OR_VIEW = {"ToCopyBackward0", "TBackward0", "ViewBackward0", "TransposeBackward0", "PermuteBackward0",
                "ExpandBackward0", "UnsafeViewBackward0", "AliasBackward0"}  # fmt: skip


def _cast_of_parameter(tensor: torch.Tensor, depth: int = 4) -> bool:
    """Whether ``tensor`` is a parameter seen through casts and views (autocast's low-precision weight copy,
    ``w.t()``): its grad_fn chain reaches a parameter's AccumulateGrad through :data:`CAST_OR_VIEW` nodes only.
    Autocast keeps that copy for the whole forward anyway, so offloading it would free nothing; the tracer
    counts none."""
    node = tensor.grad_fn
    while node is not None and type(node).__name__ in CAST_OR_VIEW and depth > 0:
        inputs = [n for n, _ in node.next_functions if n is not None]
        if len(inputs) != 1:
            return False
        node, depth = inputs[0], depth - 1
        if type(node).__name__ == "AccumulateGrad":
            return True
    return False


def _plain(tensor: Any) -> bool:
    """A dense tensor with its own storage (not a DTensor, a subclass, sparse or meta)."""
    return type(tensor) in (torch.Tensor, nn.Parameter) and tensor.layout == torch.strided and not tensor.is_meta


def apply_activation_offload(*, module: nn.Module, blocks: list[str], offload: ActivationOffload) -> int:
    """Wrap every block of ``blocks`` present in ``module``; return how many."""
    present = dict(module.named_modules())
    for fqn in blocks:
        if fqn in present:
            offload.wrap(present[fqn])
    return sum(fqn in present for fqn in blocks)


def activation_copies(offload: ActivationOffload | None, since: Counter | None = None) -> Counter | list:
    """The copies so far (a Counter to pass back as ``since``), or, given ``since``, those made after it as
    the audit's comm rows (dim "host", kind, count, bytes); nothing without activation offload."""
    copies = offload.copies if offload is not None else Counter()
    if since is None:
        return Counter(copies)
    new = copies - since
    kinds = ("act_d2h", "act_h2d")
    return [("host", kind, new[(kind, "count")], new[(kind, "bytes")]) for kind in kinds if new[(kind, "count")]]


def link_copies(trainer: Any, since: tuple | None = None) -> tuple | list:
    """What crossed the host link: ZeRO-Offload's copies (execute/offload.py ``host_copies``) and the saved
    activations'; as :func:`activation_copies`, counters to pass back as ``since``, or the rows since."""
    offload = getattr(trainer, "activation_offload", None)
    if since is None:
        return host_copies(trainer.optimizer), activation_copies(offload)
    return host_copies(trainer.optimizer, since=since[0]) + activation_copies(offload, since=since[1])
