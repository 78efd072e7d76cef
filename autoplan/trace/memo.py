"""Measure each distinct call once: replay the measurement for later identical calls.

A GPT-3 has 96 blocks whose nodes make the same calls on tensors of the same layout; measuring
each of them on FakeTensors (forward, backward, saved tensors) is most of a trace. A node's
measurement is a function of its :func:`call_key`:

- the callable: an ATen op, a function defined in ``torch``/``operator``/``math``, a Tensor
  method, or a ``torch.nn`` module given by its class, its non-tensor attributes (``training``,
  ``eps``, ...), its parameters' and buffers' layouts and its children, with no hooks;
- every non-tensor argument, by type and value;
- every tensor argument's layout (type, shape, stride, offset, dtype, device, storage bytes),
  ``requires_grad``, whether it is a parameter or buffer, and which arguments are the same
  object or share a storage; and which of them are the parameters whose gradient is taken.

Global torch state (grad mode, default dtype, SDPA backend) is fixed during a trace, and the
propagator runs each node on private copies of its activations, so the autograd history of an
argument cannot leak in. Two nodes with equal keys therefore compute the same FLOPs, outputs of
the same layout and the same pattern of saved storages. The first runs for real and leaves a
:class:`Record`: the FLOPs, each output as "a view of input j" / "a view of new storage m" /
a constant, and each tensor autograd saved as "input j" / "new output storage m" / "a new
intermediate of N bytes". Later nodes replay it against their own inputs: the outputs are made
with the recorded layouts and the saved storages are charged through the propagator's own
dedup and attribution, so every number is what a real run would have recorded.

A call outside what the key describes is never replayed: a user-defined function or module,
an argument of unknown type, a parameter view with autograd history, an output that views a
parameter or reinterprets an input's dtype, or a saved tensor from outside the call.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.fx
from torch._subclasses.fake_tensor import FakeTensor
from torch.fx.immutable_collections import immutable_dict, immutable_list
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._mode_utils import no_dispatch
from torch.utils._pytree import tree_flatten, tree_unflatten

_SCALARS = (bool, int, float, complex, str, type(None), type(Ellipsis), torch.dtype, torch.device, torch.layout, torch.memory_format)
_FUNCTION_MODULES = ("torch", "_operator", "operator", "math")
_BUILTINS = (getattr, len, isinstance)
_SEQUENCES = (tuple, list, immutable_list)  # torch.fx keeps a node's list arguments as immutable_list
_MAPPINGS = (dict, immutable_dict)


def _is_sequence(kind: type) -> bool:
    """A tuple/list, fx's immutable_list, or a torch.return_types result (topk's (values, indices))."""
    return kind in _SEQUENCES or (issubclass(kind, tuple) and kind.__module__ == "torch.return_types")
_MODULE_STRUCTURE = ("_parameters", "_buffers", "_modules")
_GLOBAL_HOOKS = ("_global_forward_pre_hooks", "_global_forward_hooks", "_global_backward_pre_hooks", "_global_backward_hooks")


class NotMemoizable(Exception):
    """This call is outside what a key describes; measure it for real."""


@dataclass(frozen=True)
class Output:
    kind: str  # 'const', 'same' (as an earlier output), 'in' (on input leaf index's storage), 'new' (on new storage index)
    index: int = 0
    value: Any = None  # the constant, or a tensor's (fake) device
    layout: tuple = ()  # (shape, stride, offset, requires_grad, dtype) for tensors


@dataclass(frozen=True)
class Record:
    fwd_flops: int
    bwd_flops: int
    spec: Any  # the output's pytree spec
    outputs: tuple[Output, ...]
    storages: tuple[tuple[int, torch.dtype], ...]  # new storages: bytes, dtype
    packs: tuple[tuple[str, int, int], ...]  # ('in' | 'new' | 'tmp', index, storage bytes)
    fake_mode: Any = None


# ---- keys ------------------------------------------------------------------------------------
def const_key(value: Any) -> Any:
    """A hashable stand-in for a non-tensor value, distinguishing types (1 vs True vs 1.0)."""
    kind = type(value)
    if kind is float:
        return (float, repr(value))
    if kind in _SCALARS:
        return (kind, value)
    if _is_sequence(kind) or kind is torch.Size:
        return (kind, tuple(const_key(v) for v in value))
    if kind in (set, frozenset):
        return (kind, frozenset(const_key(v) for v in value))
    if kind in _MAPPINGS:
        return (kind, tuple((const_key(k), const_key(v)) for k, v in value.items()))
    if kind is slice:
        return (slice, const_key(value.start), const_key(value.stop), const_key(value.step))
    raise NotMemoizable(f"argument of type {kind.__name__}")


def tensor_layout(tensor: torch.Tensor, storage_nbytes: int | None = None) -> tuple:
    nbytes = tensor.untyped_storage().nbytes() if storage_nbytes is None else storage_nbytes
    return (type(tensor), tuple(tensor.shape), tensor.stride(), tensor.storage_offset(), tensor.dtype, tensor.device,
            tensor.layout, nbytes, tensor.requires_grad, tensor.is_conj(), tensor.is_neg())


class _ArgWalker:
    """Freezes (args, kwargs) into a key, collecting the tensor leaves in a fixed order."""

    def __init__(self, storage_key: Callable[[torch.Tensor], Any], frozen: set) -> None:
        self.storage_key, self.frozen = storage_key, frozen
        self.leaves: list[torch.Tensor] = []
        self.first_id: dict[int, int] = {}
        self.first_storage: dict[Any, int] = {}

    def walk(self, value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            return self.tensor(value)
        kind = type(value)
        if _is_sequence(kind):
            return (kind, tuple(self.walk(v) for v in value))
        if kind in _MAPPINGS:
            return (kind, tuple((const_key(k), self.walk(v)) for k, v in value.items()))
        return const_key(value)

    def tensor(self, t: torch.Tensor) -> tuple:
        index = len(self.leaves)
        self.leaves.append(t)
        storage = t.untyped_storage()
        nbytes = storage.nbytes()
        is_frozen = StorageWeakRef(storage) in self.frozen
        if is_frozen and t.grad_fn is not None:
            raise NotMemoizable("a parameter view with autograd history")
        if not is_frozen and nbytes % t.element_size():
            raise NotMemoizable("a storage shared between dtypes")
        # a parameter or buffer is passed to the call as it is; an activation is copied first
        as_is = (isinstance(t, torch.nn.Parameter), t._is_view()) if is_frozen else None
        return ("T", tensor_layout(t, nbytes), is_frozen, as_is,
                self.first_id.setdefault(id(t), index), self.first_storage.setdefault(self.storage_key(t), index))


def call_key(node: torch.fx.Node, module: torch.nn.Module | None, args: tuple, kwargs: dict, extra_params: list[torch.Tensor],
             *, storage_key: Callable, frozen: set, module_keys: dict[int, Any], hook_owner: Any = None) -> tuple[Any, list[torch.Tensor]]:
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
        if isinstance(hooks, dict) and any(getattr(h, "__self__", None) is not owner or owner is None for h in hooks.values()):
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
    tensors = tuple((kind, name, None if t is None else tensor_layout(t))
                    for kind in ("_parameters", "_buffers") for name, t in getattr(module, kind).items())
    children = tuple((name, None if child is None else _module_key(child)) for name, child in module._modules.items())
    first: dict[int, int] = {}
    params = [p for _, p in module.named_parameters(remove_duplicate=False)]
    ties = tuple(first.setdefault(id(p), i) for i, p in enumerate(params))  # which parameters are tied
    return (cls, tuple(state), tensors, children, ties)


# ---- recording -------------------------------------------------------------------------------
def record(*, output: Any, leaves: list[torch.Tensor], packs: list[tuple[Any, int, bool]], fwd: int, bwd: int,
           storage_key: Callable, frozen: set, owner: dict) -> Record:
    """What a real run did, in terms of its inputs; raises NotMemoizable if it cannot be replayed."""
    inputs: dict[Any, int] = {}
    for index, tensor in enumerate(leaves):
        inputs.setdefault(storage_key(tensor), index)
    flat, spec = tree_flatten(output)
    new: dict[Any, int] = {}
    storages: list[tuple[int, torch.dtype]] = []
    outputs = tuple(_output(v, i, flat, leaves, inputs, new, storages, storage_key, frozen, owner) for i, v in enumerate(flat))
    modes = {id(v.fake_mode): v.fake_mode for v in flat if isinstance(v, FakeTensor)}
    if len(modes) > 1:
        raise NotMemoizable("outputs of several fake modes")
    return Record(fwd_flops=int(fwd), bwd_flops=int(bwd), spec=spec, outputs=outputs, storages=tuple(storages),
                  packs=_pack_events(packs, inputs, new, frozen, owner), fake_mode=next(iter(modes.values()), None))


def _output(value: Any, position: int, flat: list, leaves: list, inputs: dict, new: dict, storages: list,
            storage_key: Callable, frozen: set, owner: dict) -> Output:
    if not isinstance(value, torch.Tensor):
        const_key(value)  # only immutable, known types
        return Output("const", value=value)
    earlier = next((i for i in range(position) if flat[i] is value), None)
    if earlier is not None:
        return Output("same", index=earlier)
    if type(value) is not FakeTensor or value.is_conj() or value.is_neg():
        raise NotMemoizable("an output that is not a plain FakeTensor")
    key = storage_key(value)
    layout = (tuple(value.shape), value.stride(), value.storage_offset(), value.requires_grad, value.dtype)
    if key in frozen:
        raise NotMemoizable("an output that views a parameter")
    if key in inputs:
        source = leaves[inputs[key]]
        if source.dtype != value.dtype or StorageWeakRef(source.untyped_storage()) in frozen:
            raise NotMemoizable("an output that reinterprets an input")
        return Output("in", index=inputs[key], value=value.device, layout=layout)
    if key in owner:
        raise NotMemoizable("an output on a storage from outside the call")
    return Output("new", index=_new_storage(key, value, new, storages), value=value.device, layout=layout)


def _new_storage(key: Any, value: torch.Tensor, new: dict, storages: list) -> int:
    nbytes = value.untyped_storage().nbytes()
    if key not in new:
        if nbytes % value.element_size():
            raise NotMemoizable("a storage shared between dtypes")
        new[key] = len(storages)
        storages.append((nbytes, value.dtype))
    if storages[new[key]][1] != value.dtype:
        raise NotMemoizable("a storage shared between dtypes")
    return new[key]


def _pack_events(packs: list[tuple[Any, int, bool]], inputs: dict, new: dict, frozen: set, owner: dict) -> tuple:
    events, temps = [], {}
    for key, nbytes, was_seen in packs:
        if key in frozen:
            continue  # parameters and buffers are never charged
        if key in inputs:
            events.append(("in", inputs[key], nbytes))
        elif key in new:
            events.append(("new", new[key], nbytes))
        elif key not in owner and (not was_seen or key in temps):
            events.append(("tmp", temps.setdefault(key, len(temps)), nbytes))
        else:
            raise NotMemoizable("a saved tensor from outside the call")
    return tuple(events)


# ---- replaying -------------------------------------------------------------------------------
def replay(rec: Record, leaves: list[torch.Tensor], *, storage_key: Callable, charge: Callable[[Any, int], None]) -> Any:
    """Rebuild the output on ``leaves`` and charge the saved storages; returns the output.

    Each output FakeTensor is made the way FakeTensorMode makes its results: a meta tensor with
    the recorded layout on the right storage (an input's, or a new one), wrapped by the mode's
    converter. That skips dispatching an op through the FLOP counter and the fake mode."""
    with no_dispatch():
        bases = [torch.empty(nbytes // dtype.itemsize, dtype=dtype, device="meta") for nbytes, dtype in rec.storages]
        metas = [_meta(out, leaves, bases) for out in rec.outputs]
    values: list[Any] = []
    for out, meta in zip(rec.outputs, metas):
        values.append(_rebuild(rec, out, meta, values))
    temps: dict[int, object] = {}
    for kind, index, nbytes in rec.packs:
        if kind == "in":
            key = storage_key(leaves[index])
        elif kind == "new":
            key = StorageWeakRef(bases[index].untyped_storage())
        else:
            key = temps.setdefault(index, object())
        charge(key, nbytes)
    return tree_unflatten(values, rec.spec)


def _meta(out: Output, leaves: list[torch.Tensor], bases: list[torch.Tensor]) -> torch.Tensor | None:
    """Under no_dispatch: a meta tensor with the output's layout on its storage."""
    if out.kind not in ("in", "new"):
        return None
    shape, stride, offset, grad, dtype = out.layout
    storage = leaves[out.index].untyped_storage() if out.kind == "in" else bases[out.index].untyped_storage()
    meta = torch.empty(0, dtype=dtype, device="meta").set_(storage, offset, shape, stride)
    return meta.requires_grad_(True) if grad else meta


def _rebuild(rec: Record, out: Output, meta: torch.Tensor | None, values: list) -> Any:
    if out.kind == "const":
        return out.value
    if out.kind == "same":
        return values[out.index]
    return rec.fake_mode.fake_tensor_converter.from_meta_and_device(rec.fake_mode, meta, out.value)
