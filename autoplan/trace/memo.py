"""Measure each distinct call once: replay the measurement for later identical calls
(docs/trace.md, "Replaying identical calls": what the key holds and why replay is exact).

A node's measurement on FakeTensors (FLOPs, outputs, saved tensors) is a function of its key
(trace/memo_keys.py, :func:`call_key`): the callable, every non-tensor argument by type and value,
and every tensor argument's layout, ``requires_grad``, role and aliasing. The first node with a key
runs for real and leaves a :class:`Record`: its FLOPs, each output as "a view of input j" / "a view
of new storage m" / a constant, and each saved tensor as "input j" / "new output storage m" / "a
new intermediate of N bytes". Later nodes replay it against their own inputs, and the saved
storages go through the propagator's own dedup and attribution. A call on parameters and buffers
alone that saves nothing and returns views of them (``w.transpose(1, 2)``, ``w.to(w.dtype)``) is
replayed by calling it again unmeasured (:attr:`Record.rerun`): the view keeps the ``grad_fn`` a
later call differentiates through. A call outside what the key describes (a user-defined function
or module, an argument of unknown type, another output viewing a parameter or reinterpreting a
dtype, a saved tensor from outside the call) is never replayed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.fx
from torch._subclasses.fake_tensor import FakeTensor
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._mode_utils import no_dispatch
from torch.utils._pytree import tree_flatten, tree_unflatten

from autoplan.trace.memo_keys import NotMemoizable, const_key


@dataclass(frozen=True)
class Output:
    # 'const', 'same' (as an earlier output), 'in' (on input leaf index's storage), 'new' (on new storage index)
    kind: str
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
    rerun: bool = False  # replayed by calling it again, unmeasured (outputs view the parameters it takes)


# ---- keys ------------------------------------------------------------------------------------
def record(
    *,
    output: Any,
    leaves: list[torch.Tensor],
    packs: list[tuple[Any, int, bool]],
    fwd: int,
    bwd: int,
    storage_key: Callable,
    frozen: set,
    owner: dict,
) -> Record:
    """What a real run did, in terms of its inputs; raises NotMemoizable if it cannot be replayed."""
    inputs: dict[Any, int] = {}
    for index, tensor in enumerate(leaves):
        inputs.setdefault(storage_key(tensor), index)
    flat, spec = tree_flatten(output)
    if _views_frozen_only(flat, leaves, packs, storage_key, frozen):
        return Record(fwd_flops=int(fwd), bwd_flops=int(bwd), spec=spec, outputs=(), storages=(), packs=(), rerun=True)
    new: dict[Any, int] = {}
    storages: list[tuple[int, torch.dtype]] = []
    outputs = tuple(
        _output(v, i, flat, leaves, inputs, new, storages, storage_key, frozen, owner) for i, v in enumerate(flat)
    )
    modes = {id(v.fake_mode): v.fake_mode for v in flat if isinstance(v, FakeTensor)}
    if len(modes) > 1:
        raise NotMemoizable("outputs of several fake modes")
    return Record(
        fwd_flops=int(fwd),
        bwd_flops=int(bwd),
        spec=spec,
        outputs=outputs,
        storages=tuple(storages),
        packs=_pack_events(packs, inputs, new, frozen, owner),
        fake_mode=next(iter(modes.values()), None),
    )


def _views_frozen_only(flat: list, leaves: list, packs: list, storage_key: Callable, frozen: set) -> bool:
    """Whether a call takes only parameters and buffers (no activation), saves nothing, and returns
    only views of them: calling it again gives the measured call's outputs, grad_fn included, since
    the propagator passes such tensors to the call as they are (propagate.py, ``_localize``)."""
    tensors = [v for v in flat if isinstance(v, torch.Tensor)]
    return (
        bool(tensors)
        and not packs
        and all(storage_key(t) in frozen for t in leaves)
        and all(storage_key(t) in frozen for t in tensors)
    )


def _output(
    value: Any,
    position: int,
    flat: list,
    leaves: list,
    inputs: dict,
    new: dict,
    storages: list,
    storage_key: Callable,
    frozen: set,
    owner: dict,
) -> Output:
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
def replay(
    rec: Record, leaves: list[torch.Tensor], *, storage_key: Callable, charge: Callable[[Any, int], None]
) -> Any:
    """Rebuild the output on ``leaves`` and charge the saved storages; returns the output (a
    :attr:`Record.rerun` record is replayed by the caller, which calls the node again).

    Each output FakeTensor is made the way FakeTensorMode makes its results: a meta tensor with
    the recorded layout on the right storage (an input's, or a new one), wrapped as the mode's
    converter wraps one (``FakeTensor(mode, meta, device)``). That skips dispatching an op through
    the FLOP counter and the fake mode. The converter's memo of meta tensors is skipped too: each
    meta tensor here is fresh and dropped at once, so no later conversion could look it up
    (``from_meta_and_device`` took three times as long, ~0.2 s of DeepSeek-V3's 9,650 outputs)."""
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
    return FakeTensor(rec.fake_mode, meta, out.value)
