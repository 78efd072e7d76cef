"""The key of a call: what its measurement is a function of (trace/memo.py, module docstring).

:func:`call_key` covers the callable (an ATen op, a ``torch``/``operator``/``math`` function, a
Tensor method, or a ``torch.nn`` module by class, attributes, parameter layouts and children,
with no hooks), every non-tensor argument by type and value, and every tensor argument's
layout, ``requires_grad``, parameter-ness and aliasing. Anything it cannot describe raises
:class:`NotMemoizable`, and the propagator measures that call for real.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
import torch.fx
from torch.fx.immutable_collections import immutable_dict, immutable_list
from torch.multiprocessing.reductions import StorageWeakRef

_SCALARS = (
    bool,
    int,
    float,
    complex,
    str,
    type(None),
    type(Ellipsis),
    torch.dtype,
    torch.device,
    torch.layout,
    torch.memory_format,
)
_FUNCTION_MODULES = ("torch", "_operator", "operator", "math")
_BUILTINS = (getattr, len, isinstance)
_SEQUENCES = (tuple, list, immutable_list)  # torch.fx keeps a node's list arguments as immutable_list
_MAPPINGS = (dict, immutable_dict)
# the same types as sets: a key walks ~6 values per call, 60,000 on DeepSeek-V3, most of them scalars
_SCALAR_SET, _SEQUENCE_SET, _MAPPING_SET = frozenset(_SCALARS), frozenset(_SEQUENCES), frozenset(_MAPPINGS)


def _is_sequence(kind: type) -> bool:
    """A tuple/list, fx's immutable_list, or a torch.return_types result (topk's (values, indices))."""
    return kind in _SEQUENCE_SET or (issubclass(kind, tuple) and kind.__module__ == "torch.return_types")


_MODULE_STRUCTURE = ("_parameters", "_buffers", "_modules")
_GLOBAL_HOOKS = (
    "_global_forward_pre_hooks",
    "_global_forward_hooks",
    "_global_backward_pre_hooks",
    "_global_backward_hooks",
)


class NotMemoizable(Exception):
    """This call is outside what a key describes; measure it for real."""


def const_key(value: Any) -> Any:
    """A hashable stand-in for a non-tensor value, distinguishing types (1 vs True vs 1.0)."""
    kind = type(value)
    if kind is float:
        return (float, repr(value))
    if kind in _SCALAR_SET:
        return (kind, value)
    if _is_sequence(kind) or kind is torch.Size:
        return (kind, tuple(const_key(v) for v in value))
    if kind in (set, frozenset):
        return (kind, frozenset(const_key(v) for v in value))
    if kind in _MAPPING_SET:
        return (kind, tuple((const_key(k), const_key(v)) for k, v in value.items()))
    if kind is slice:
        return (slice, const_key(value.start), const_key(value.stop), const_key(value.step))
    raise NotMemoizable(f"argument of type {kind.__name__}")


def tensor_layout(tensor: torch.Tensor, storage_nbytes: int | None = None) -> tuple:
    nbytes = tensor.untyped_storage().nbytes() if storage_nbytes is None else storage_nbytes
    return (
        type(tensor),
        tuple(tensor.shape),
        tensor.stride(),
        tensor.storage_offset(),
        tensor.dtype,
        tensor.device,
        tensor.layout,
        nbytes,
        tensor.requires_grad,
        tensor.is_conj(),
        tensor.is_neg(),
    )


class _ArgWalker:
    """Freezes (args, kwargs) into a key, collecting the tensor leaves in a fixed order."""

    def __init__(self, storage_key: Callable[[torch.Tensor], Any], frozen: set) -> None:
        self.storage_key, self.frozen = storage_key, frozen
        self.leaves: list[torch.Tensor] = []
        self.first_id: dict[int, int] = {}
        self.first_storage: dict[Any, int] = {}

    def walk(self, value: Any) -> Any:
        kind = type(value)
        if kind in _SCALAR_SET and kind is not float:  # const_key's answer, without its calls
            return (kind, value)
        if isinstance(value, torch.Tensor):
            return self.tensor(value)
        if _is_sequence(kind):
            return (kind, tuple([self.walk(v) for v in value]))
        if kind in _MAPPING_SET:
            return (kind, tuple([(const_key(k), self.walk(v)) for k, v in value.items()]))
        return const_key(value)

    def tensor(self, t: torch.Tensor) -> tuple:
        index = len(self.leaves)
        self.leaves.append(t)
        storage = t.untyped_storage()
        nbytes = storage.nbytes()
        is_frozen = StorageWeakRef(storage) in self.frozen
        if not is_frozen and nbytes % t.element_size():
            raise NotMemoizable("a storage shared between dtypes")
        # a parameter or buffer is passed to the call as it is; an activation is copied first. A
        # parameter view with autograd history is a gradient leaf of the call (propagate.py, _localize)
        as_is = (isinstance(t, torch.nn.Parameter), t._is_view(), t.grad_fn is not None) if is_frozen else None
        return (
            "T",
            tensor_layout(t, nbytes),
            is_frozen,
            as_is,
            self.first_id.setdefault(id(t), index),
            self.first_storage.setdefault(self.storage_key(t), index),
        )


def call_key(
    node: torch.fx.Node,
    module: torch.nn.Module | None,
    args: tuple,
    kwargs: dict,
    extra_params: list[torch.Tensor],
    *,
    storage_key: Callable,
    frozen: set,
    module_keys: dict[int, Any],
    hook_owner: Any = None,
) -> tuple[Any, list[torch.Tensor]]:
    """(key, tensor leaves of the arguments); raises NotMemoizable. ``hook_owner``: the object whose
    global module hooks are known to change nothing measured (the FLOP counter's module tracker)."""
    walker = _ArgWalker(storage_key, frozen)
    arguments = walker.walk((tuple(args), dict(kwargs)))
    if module is not None:
        _check_global_hooks(hook_owner)
        if id(module) not in module_keys:
            module_keys[id(module)] = _module_key_or_none(module)
        target = module_keys[id(module)]
        grads_of: tuple = ()
    else:
        target = _function_key(node, args)
        ids = {id(t): i for i, t in reversed(list(enumerate(walker.leaves)))}
        if any(id(p) not in ids for p in extra_params):
            raise NotMemoizable("a parameter outside the arguments")
        grads_of = tuple(ids[id(p)] for p in extra_params)
    if target is None:
        raise NotMemoizable("a callable outside torch")
    return (node.op, target, arguments, grads_of), walker.leaves


def _function_key(node: torch.fx.Node, args: tuple) -> Any:
    target = node.target
    if node.op == "call_method":
        return ("method", target) if args and isinstance(args[0], torch.Tensor) else None
    if node.op != "call_function":
        return None
    if isinstance(target, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)) or any(target is b for b in _BUILTINS):
        return target
    owner = getattr(target, "__module__", None) or ""
    if owner.split(".")[0] in _FUNCTION_MODULES:
        return target
    return None


def _module_key_or_none(module: torch.nn.Module) -> Any:
    try:
        return _module_key(module)
    except NotMemoizable:
        return None


def _check_global_hooks(owner: Any) -> None:
    """Global module hooks run user code on every module call; only ``owner``'s are allowed
    (FlopCounterMode's module tracker: it tracks the module hierarchy for a per-module table
    that the trace does not read, so FLOP totals and saved tensors are the same without it)."""
    from torch.nn.modules import module as module_mod

    for name in _GLOBAL_HOOKS:
        hooks = getattr(module_mod, name, None)
        if isinstance(hooks, dict) and any(
            getattr(h, "__self__", None) is not owner or owner is None for h in hooks.values()
        ):
            raise NotMemoizable("global module hooks")


def _module_key(module: torch.nn.Module) -> Any:
    """A torch.nn module's behaviour: its class, plain attributes, tensor layouts and children."""
    cls = type(module)
    if not cls.__module__.startswith("torch.nn.") or "forward" in vars(module):
        raise NotMemoizable("a module outside torch.nn")
    state = []
    for name, value in vars(module).items():
        if name in _MODULE_STRUCTURE:
            continue
        if "hook" in name and isinstance(value, dict):
            if value:
                raise NotMemoizable("module hooks")
            continue
        if isinstance(value, torch.Tensor):
            raise NotMemoizable("a tensor attribute")
        state.append((name, const_key(value)))
    tensors = tuple(
        (kind, name, None if t is None else tensor_layout(t))
        for kind in ("_parameters", "_buffers")
        for name, t in getattr(module, kind).items()
    )
    children = tuple((name, None if child is None else _module_key(child)) for name, child in module._modules.items())
    first: dict[int, int] = {}
    params = [p for _, p in module.named_parameters(remove_duplicate=False)]
    ties = tuple(first.setdefault(id(p), i) for i, p in enumerate(params))  # which parameters are tied
    return (cls, tuple(state), tensors, children, ties)


# ---- recording -------------------------------------------------------------------------------
