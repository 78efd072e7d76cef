"""Four DTensor behaviours that break ordinary model code, fixed once on import as DTensor custom op
handlers (docs/executor.md, "Tensor parallelism: how any model code runs correctly"):

1. **Local layout drifts from the global one** after a redistribution, so ``.contiguous()`` is a
   no-op and a later ``.view()`` fails. Handler for ``aten.view``: when the local tensor's dim
   order differs from the global one, it is first copied into the global dim order, then viewed.
2. **In-place op on a non-replicated self** (``var.add_(eps)`` on a ``Partial`` mean). Handler for
   every in-place op DTensor has a rule for: if sharding propagation fails and ``self`` is not
   replicated, ``self`` is redistributed to ``Replicate`` in place and the op retried, counted in
   ``RESHARDED``. Ops that work on their placement take the normal path untouched.
3. **In-place op on a plain tensor from a DTensor** (a buffer updated from an activation under tp:
   ``self.running.mul_(0.9).add_(0.1 * h.mean(0))``): DTensor's dispatch asserted (a bare
   ``AssertionError``). The DTensor operands are made whole (``full_tensor``: a collective only for a
   shard or a partial sum, on every tp rank alike) and the op runs on plain tensors, as on one device.
4. **A convolution over a sharded length** (Hugging Face Mamba: the rowwise ``in_proj``'s sequence-sharded output,
   transposed, into its depthwise ``conv1d``): DTensor's rule (torch 2.13) returned a ``Shard(0)`` output of the
   wrong global shape, which failed the next redistribution ("narrow unexpectedly changed concrete size"); each
   window needs its neighbours' positions. Handler for ``aten.convolution`` and its backward, in front of torch's
   own (``torch/distributed/tensor/_tp_conv.py``, which it then calls): an activation sharded on a spatial dim
   (>= 2) is made ``Replicate`` first (an all-gather, counted in ``RESHARDED``).

A handler reaches DTensor's normal dispatch by removing itself from the handler table for that
one call (under a lock).
"""

from __future__ import annotations

import threading
import warnings
from collections import Counter
from typing import Any, Callable

import torch
from torch.distributed.tensor import DTensor, Replicate
from torch.utils._pytree import tree_map_only

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
    if args and isinstance(args[0], torch.Tensor) and not isinstance(args[0], DTensor):  # 3. in the module docstring
        whole = tree_map_only(DTensor, DTensor.full_tensor, (args, kwargs))
        return op_call(*whole[0], **whole[1])
    try:
        return _default(op_call, _inplace_handler, args, kwargs)
    except RuntimeError:
        target = args[0]
        if not isinstance(target, DTensor) or all(p.is_replicate() for p in target.placements):
            raise
        _note_reshard(str(op_call), target)
        replicate_in_place(target)
        return _default(op_call, _inplace_handler, args, kwargs)


def _note_reshard(op: str, target: DTensor, *, how: str = "in place") -> None:
    """Count the fallback and warn once per op: it all-gathers a tensor the cost model priced as sharded."""
    if not RESHARDED[op]:
        warnings.warn(
            f"{op} cannot run {how} on a {tuple(target.placements)} DTensor of shape {tuple(target.shape)}; "
            "autoplan replicates it first, an all-gather the cost model does not price. Mark the module that "
            "produces it 'replicate' in tp_plan to avoid it (`autoplan run --audit` counts these: its "
            "'in-place reshards' rows).",
            stacklevel=3,
        )
    RESHARDED[op] += 1


#: convolution ops and how many of their leading arguments are activations (forward: input; backward: the output's
#: gradient and the input)
CONVOLUTIONS = {aten.convolution.default: 1, aten.convolution_backward.default: 2}
#: torch's own handlers of the convolutions, which autoplan's calls after its own step
_TORCH_HANDLERS: dict = {}


def _spatially_sharded(x: Any) -> bool:
    return isinstance(x, DTensor) and any(p.is_shard() and p.dim >= 2 for p in x.placements)


def _convolution_handler(op_call: Any, args: tuple, kwargs: dict) -> Any:
    """4. in the module docstring."""
    activations = CONVOLUTIONS[op_call]
    if any(_spatially_sharded(a) for a in args[:activations]):
        whole = []
        for arg in args[:activations]:
            if _spatially_sharded(arg):
                _note_reshard(str(op_call), arg, how="over a sharded length")
                arg = arg.redistribute(arg.device_mesh, [Replicate()] * arg.device_mesh.ndim)
            whole.append(arg)
        args = (*whole, *args[activations:])
    own = _TORCH_HANDLERS.get(op_call)
    return own(op_call, args, kwargs) if own is not None else _default(op_call, _convolution_handler, args, kwargs)


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
    """Register the handlers (idempotent). Torch's own handler of an op is kept, except the convolutions', which
    autoplan's handler stands in front of and then calls (item 4)."""
    _HANDLERS.setdefault(aten.view.default, _view_handler)
    for op in CONVOLUTIONS:
        if _HANDLERS.get(op) is not _convolution_handler:
            _TORCH_HANDLERS[op] = _HANDLERS.get(op)
            _HANDLERS[op] = _convolution_handler
    for op in inplace_ops():
        _HANDLERS.setdefault(op, _inplace_handler)


install()
