"""Trace MoE layers that loop over their experts, under the routing model (types/moe.py;
docs/moe.md, "Which experts are recognised").

Such a layer (transformers 4.x Mixtral and Qwen2-MoE) selects each expert's (token, choice) pairs
with ``torch.where``, ``nonzero``, ``argwhere`` or a boolean mask: data-dependent sizes that fake
tensors cannot trace. The layer is recognised by its structure (``trace.moe.experts_of``) and the
``topk`` its forward calls on ``E`` experts' scores, which gives ``T`` tokens and ``k`` choices.
Inside that forward only, :class:`LoopRouting` (a ``TorchFunctionMode``) answers each row
selection with ``torch.nonzero_static`` at the routing model's size; a mask of ``N`` elements has

    N = T * k or T   ->  C true entries        (one expert's pairs, or its tokens)
    N = E            ->  E                     (the experts that received tokens)
    N = E*T, E*T*k   ->  E * C                 (every expert's pairs)

with ``C = routing.slots_per_expert(T, k, E)`` (never more than ``N``). A mask of any other size
runs as written, and the trace stops with the usual sentence naming the op.
"""

from __future__ import annotations

import contextlib
import itertools
from typing import Any, Callable, Iterator

import torch
import torch.nn as nn
from torch.overrides import TorchFunctionMode

from autoplan.errors import TraceError
from autoplan.trace.forwards import replaced_forwards
from autoplan.types.moe import RoutingModel

_TOPK = (torch.topk, torch.Tensor.topk)
_NONZERO = (torch.nonzero, torch.Tensor.nonzero, torch.argwhere, torch.Tensor.argwhere)
_INDEXING = (torch.Tensor.__getitem__, torch.Tensor.__setitem__)
_TO_INT = (torch.Tensor.__index__, torch.Tensor.__int__, torch.Tensor.item)


class LoopRouting(TorchFunctionMode):
    """Inside one loop-written MoE layer's forward: data-dependent row selections sized by the
    routing model (module docstring); ``saw(T)`` is told the tokens the layer's top-k scored."""

    def __init__(self, *, layer: str, experts: int, routing: RoutingModel, saw: Callable[[int], None]) -> None:
        super().__init__()
        self.layer, self.experts, self.routing, self.saw = layer, experts, routing, saw
        self.tokens: int | None = None
        self.top_k: int | None = None
        self.sized = 0  # row selections answered under the routing model
        self.known: dict[int, tuple[torch.Tensor, Any]] = {}  # id -> (tensor, its value under the routing model)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        value = self._value(args[0]) if args else None
        if value is not None:
            return self._concrete(func, args, kwargs, value)
        if func in _TOPK:
            return self._topk(func, args, kwargs)
        if func in _NONZERO or (func is torch.where and len(args) + len(kwargs) == 1):
            return self._nonzero(func, args, kwargs)
        if func in _INDEXING and len(args) >= 2 and _has_mask(args[1]):
            args = (args[0], self._mask_to_indices(args[1]), *args[2:])
        return func(*args, **kwargs)

    def _topk(self, func, args: tuple, kwargs: dict) -> Any:
        """Run it; when it picks among the layer's experts, remember ``T`` and ``k``."""
        scores = args[0] if args else kwargs["input"]
        k = args[1] if len(args) > 1 else kwargs["k"]
        dim = args[2] if len(args) > 2 else kwargs.get("dim", -1)
        _refuse_symbolic(scores, self.layer)
        last = scores.dim() >= 1 and dim in (-1, scores.dim() - 1)
        if isinstance(k, int) and last and scores.shape[dim] == self.experts:
            self.tokens, self.top_k = scores.numel() // self.experts, k
            self.saw(self.tokens)
        return func(*args, **kwargs)

    def _nonzero(self, func, args: tuple, kwargs: dict) -> Any:
        mask = args[0] if args else next(iter(kwargs.values()))
        size = self.true_entries(mask)
        if size is None:
            return func(*args, **kwargs)
        found = torch.nonzero_static(mask, size=size)
        every = size == mask.numel() <= self.experts  # every expert received tokens: their positions are known
        positions = [list(p) for p in itertools.product(*map(range, mask.shape))] if every else None
        if func is torch.where or kwargs.get("as_tuple", False):
            columns = found.unbind(1)
            return tuple(self._know(c, [p[d] for p in positions]) if every else c for d, c in enumerate(columns))
        return self._know(found, positions) if every else found

    # ---- values known under the routing model -------------------------------------------------
    def _know(self, tensor: torch.Tensor, value: Any) -> torch.Tensor:
        self.known[id(tensor)] = (tensor, value)
        return tensor

    def _value(self, tensor: Any) -> Any:
        entry = self.known.get(id(tensor)) if isinstance(tensor, torch.Tensor) else None
        return entry[1] if entry is not None and entry[0] is tensor else None

    def _concrete(self, func, args: tuple, kwargs: dict, value: Any) -> Any:
        """An op on the experts that received tokens (every expert, in order): iterating them,
        indexing a row and reading it as an int give the values, so ``self.experts[expert_idx]``
        picks the right expert (transformers 4.48+ loops ``for expert_idx in expert_hit``)."""
        if func in _TO_INT:
            flat = _flat(value)
            return int(flat[0]) if len(flat) == 1 else func(*args, **kwargs)
        if func is torch.Tensor.tolist:
            return value
        out = func(*args, **kwargs)
        if func is torch.Tensor.unbind and (args[1:2] or [kwargs.get("dim", 0)])[0] == 0:
            return tuple(self._know(row, v) for row, v in zip(out, value))
        if func is torch.Tensor.__getitem__ and isinstance(args[1], int):
            return self._know(out, value[args[1]])
        return out

    def _mask_to_indices(self, index: Any) -> Any:
        """A boolean-mask index as the index tensors of its true entries (what indexing does with it)."""
        parts = index if isinstance(index, tuple) else (index,)
        out: list[Any] = []
        for part in parts:
            if _is_mask(part):
                size = self.true_entries(part)
                out.extend(torch.nonzero_static(part, size=size).unbind(1) if size is not None else (part,))
            else:
                out.append(part)
        return tuple(out) if isinstance(index, tuple) or len(out) > 1 else out[0]

    def true_entries(self, mask: Any) -> int | None:
        """True entries of a routing mask under the routing model (module docstring's table);
        None before the layer's top-k, or for a mask of another size."""
        _refuse_symbolic(mask, self.layer)
        if self.tokens is None or self.top_k is None or not isinstance(mask, torch.Tensor):
            return None
        tokens, k, experts, n = self.tokens, self.top_k, self.experts, mask.numel()
        slots = self.routing.slots_per_expert(tokens, k, experts)
        for marks, entries in ((tokens * k, slots), (tokens, slots), (experts, experts)):
            if n == marks:
                return self._sized(min(entries, n))
        if n in (experts * tokens, experts * tokens * k):
            return self._sized(min(experts * slots, n))
        return None

    def _sized(self, entries: int) -> int:
        self.sized += 1
        return entries


def _flat(value: Any) -> list:
    return [x for v in value for x in _flat(v)] if isinstance(value, list) else [value]


def _is_mask(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.dtype == torch.bool


def _has_mask(index: Any) -> bool:
    return _is_mask(index) or (isinstance(index, tuple) and any(_is_mask(part) for part in index))


def _refuse_symbolic(value: Any, layer: str) -> None:
    """torch.fx's proxies carry no shapes to size routing by: fail fx, so torch.export captures the layer."""
    if isinstance(value, torch.fx.Proxy):
        raise TraceError(f"MoE layer '{layer}' routes by data-dependent shapes, which torch.fx cannot size.")


@contextlib.contextmanager
def loop_routed(
    model: nn.Module, layers: dict[str, tuple[str, int]], routing: RoutingModel, seen: dict[str, int], sized: set[str]
) -> Iterator[None]:
    """Run each MoE layer of ``model`` whose experts are a list (FQN -> (experts FQN, expert
    count)) under :class:`LoopRouting` while inside; ``seen`` gets each experts module's tokens,
    ``sized`` the experts modules whose row selections the routing model sized."""
    make = {
        name: lambda module, name=name, experts=experts, count=count: _routed_forward(
            module.forward, name, count, routing, (experts, seen, sized)
        )
        for name, (experts, count) in layers.items()
    }
    with replaced_forwards(model, make):
        yield


def _routed_forward(forward: Callable, layer: str, experts: int, routing: RoutingModel, log: tuple) -> Callable:
    experts_name, seen, sized = log

    def routed_forward(*args, **kwargs):
        saw = lambda tokens: seen.__setitem__(experts_name, tokens)  # noqa: E731
        mode = LoopRouting(layer=layer, experts=experts, routing=routing, saw=saw)
        with mode:
            out = forward(*args, **kwargs)
        if mode.sized:
            sized.add(experts_name)
        return out

    return routed_forward
