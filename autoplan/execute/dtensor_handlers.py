"""Two DTensor behaviours that break ordinary model code, fixed once on import.

DTensor keeps global semantics, but two things in its eager dispatch fail on code that runs
fine unsharded; both are resolved here as DTensor custom op handlers (the mechanism torch
uses for its own corner cases), so any model's code runs unchanged:

1. **Local layout drifts from the global one.** A redistribution (e.g. all-gathering a
   sequence-sharded, transposed ``[B, H, T, hd]`` tensor) produces a *contiguous* local
   tensor, while the DTensor keeps its global (transposed) strides. An op whose output
   layout follows its input's (the CPU attention kernel, element-wise ops) then returns a
   DTensor whose global strides say "contiguous" over a local tensor that is not, so
   ``.contiguous()`` is a no-op and a later ``.view()`` fails ("view size is not
   compatible ..."). Handler for ``aten.view``: when the local tensor's dim order differs
   from the global one, the local tensor is first copied into the global dim order (values
   unchanged), then viewed.
2. **In-place op on a non-replicated self.** DTensor refuses an in-place op whose ``self``
   would have to change placement, e.g. ``var.add_(eps)`` on the ``Partial`` result of a
   mean over a sharded dim (``torch.rms_norm``'s CPU decomposition does exactly that on a
   hidden-sharded input), or an in-place op along a sharded dim. Handler for every in-place
   op DTensor has a rule for: if the op's sharding propagation fails and ``self`` is not
   replicated, ``self`` is redistributed to ``Replicate`` *in place* (same global value, so
   autograd and aliasing of the value are unaffected) and the op is retried. Ops that work
   on the current placement (``add_`` of two partial sums in gradient accumulation) take
   the normal path untouched, with no extra communication.

A handler reaches DTensor's normal dispatch by removing itself from the handler table for
that one call (under a lock; the table is a plain dict consulted on every call).
"""

from __future__ import annotations

import threading
import warnings
from collections import Counter
from typing import Any, Callable

import torch
from torch.distributed.tensor import DTensor, Replicate

aten = torch.ops.aten
_LOCK = threading.RLock()
_HANDLERS: dict = DTensor._op_dispatcher._custom_op_handlers


def _default(op_call: Any, handler: Callable, args: tuple, kwargs: dict) -> Any:
    """Run ``op_call`` through DTensor's normal dispatch (without ``handler``)."""
    with _LOCK:
        _HANDLERS.pop(op_call, None)
        try:
            return op_call(*args, **kwargs)
        finally:
            _HANDLERS[op_call] = handler


def _dim_order(sizes: tuple, strides: tuple) -> list[int]:
    """Dims from outermost to innermost in memory; size-1 dims do not constrain a view."""
    return sorted((d for d in range(len(sizes)) if sizes[d] != 1), key=lambda d: (-strides[d], d))


def with_global_layout(x: DTensor) -> DTensor:
    """``x`` whose local tensor is laid out in ``x``'s global dim order (a copy only if not)."""
    local = x._local_tensor
    order = _dim_order(tuple(x.shape), x.stride())
    if order == _dim_order(tuple(local.shape), local.stride()) and (local.is_contiguous() or not x.is_contiguous()):
        return x
    full_order = order + [d for d in range(x.dim()) if d not in order]
    inverse = sorted(range(x.dim()), key=full_order.__getitem__)
    relaid = local.permute(full_order).contiguous().permute(inverse)
    return DTensor(relaid, x._spec, requires_grad=False)


def _view_handler(op_call: Any, args: tuple, kwargs: dict) -> Any:
    return _default(op_call, _view_handler, (with_global_layout(args[0]), *args[1:]), kwargs)


def replicate_in_place(x: DTensor) -> None:
    """Redistribute ``x`` to all-``Replicate`` without changing its global value or identity."""
    full = x.redistribute(x.device_mesh, [Replicate()] * x.device_mesh.ndim)
    x._local_tensor = full._local_tensor
    x._spec = full._spec


#: op name -> times an in-place op forced its DTensor to Replicate (communication nobody planned)
RESHARDED: Counter = Counter()


def _inplace_handler(op_call: Any, args: tuple, kwargs: dict) -> Any:
    try:
        return _default(op_call, _inplace_handler, args, kwargs)
    except RuntimeError:
        target = args[0]
        if not isinstance(target, DTensor) or all(p.is_replicate() for p in target.placements):
            raise
        _note_reshard(str(op_call), target)
        replicate_in_place(target)
        return _default(op_call, _inplace_handler, args, kwargs)


def _note_reshard(op: str, target: DTensor) -> None:
    """Count the fallback and warn once per op: it all-gathers a tensor the cost model priced as sharded."""
    if not RESHARDED[op]:
        warnings.warn(
            f"{op} cannot run in place on a {tuple(target.placements)} DTensor of shape {tuple(target.shape)}; "
            "autoplan replicates it first, an all-gather the cost model does not price. Mark the module that "
            "produces it 'replicate' in tp_plan to avoid it (`autoplan run --audit` counts these: its "
            "'in-place reshards' rows).",
            stacklevel=3,
        )
    RESHARDED[op] += 1


def _is_inplace(op: Any) -> bool:
    schema = getattr(op, "_schema", None)
    if schema is None or not schema.arguments or schema.name.startswith("aten::_foreach"):
        return False
    first = schema.arguments[0]
    return bool(
        first.alias_info
        and first.alias_info.is_write
        and not first.is_out
        and isinstance(first.type, torch._C.TensorType)
    )


def inplace_ops() -> list:
    """Every in-place op DTensor has a sharding rule for (random ops keep DTensor's own path)."""
    prop = DTensor._op_dispatcher.sharding_propagator
    known = set(prop.op_strategy_funcs) | set(getattr(prop, "op_single_dim_strategy_funcs", {})) | set(prop.op_to_rules)
    random = getattr(DTensor._op_dispatcher, "_random_ops", set())
    return sorted((op for op in known if _is_inplace(op) and op not in random), key=str)


def install() -> None:
    """Register both handlers (idempotent; never replaces one torch registered itself)."""
    _HANDLERS.setdefault(aten.view.default, _view_handler)
    for op in inplace_ops():
        _HANDLERS.setdefault(op, _inplace_handler)


install()
