"""Run the captured graph node by node on FakeTensors and measure each node.

For every node the propagator runs the node's forward on CPU FakeTensors (no storage is
ever allocated) and measures:

- ``fwd_flops``: FlopCounterMode over the node's forward (attention per autoplan.trace.flops);
- ``bwd_flops``: FlopCounterMode over ``torch.autograd.grad`` of the node's outputs with
  respect to exactly the inputs that require grad in the real step (activations derived from
  parameters, and the node's own parameters), so a first layer fed raw data computes no
  input gradient, as in a real backward pass;
- ``saved_bytes``: every tensor autograd saves during the forward (saved_tensors_hooks),
  deduplicated by storage across the whole model, parameters and buffers excluded, and
  attributed to the node that produced the storage; a tensor no node produced (softmax
  statistics, a dropout mask, attention's logsumexp) belongs to the op that saved it.

Each node runs on private copies of its activation inputs (so in-place ops and per-node
backward passes stay local); the copies are mapped back to the storage they copy, so the
attribution and the dedup see through them.

A node whose call is identical to one already measured (same callable, arguments and tensor
layouts: autoplan.trace.memo) is not run again: its record is replayed on the node's own inputs,
which yields the same numbers (``MEMOIZE = False`` measures every node).
"""

from __future__ import annotations

import contextlib
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._pytree import tree_leaves, tree_map

from autoplan.errors import TraceError
from autoplan.trace import casts, classify, dtensor_reach, memo, memo_keys, nodeattrs, sequence_mixing
from autoplan.trace.capture import first_line, raised_in, stack_trace_line
from autoplan.trace.flops import flop_counter
from autoplan.trace.hints import data_dependent_hint

#: Replay identical calls instead of re-measuring them (autoplan.trace.memo); False measures every node.
MEMOIZE = True


class NodeFailure(TraceError):
    """A node failed on fake tensors (Propagator._failure)."""


@dataclass
class Measured:
    """One executed node, before it becomes an OpNode."""

    name: str
    node: torch.fx.Node | None
    kind: str
    op_name: str
    target: str
    module: str
    inputs: list[str]
    params: list[str]
    outputs: list[torch.Tensor]
    fwd_flops: int = 0
    bwd_flops: int = 0
    saved_bytes: int = 0
    attrs: dict[str, Any] = field(default_factory=dict)


def module_path(node: torch.fx.Node) -> str:
    """The FQN of the innermost module the node ran in ('' for the top level)."""
    if node.op == "call_module":
        return str(node.target)
    stack = node.meta.get("nn_module_stack") or {}
    if not stack:
        return ""
    return stack_path(list(stack.values())[-1][0])


def stack_path(path: str) -> str:
    """A module FQN as an ``nn_module_stack`` entry spells it, without the tracer's root prefix."""
    return path.removeprefix("L['self'].").removeprefix("L__self__.")


class Propagator:
    def __init__(self, gm: torch.fx.GraphModule, canonical: dict[str, str]) -> None:
        self.gm = gm
        self.canonical = canonical
        self.env: dict[torch.fx.Node, Any] = {}
        self.frozen = {StorageWeakRef(t.untyped_storage()) for t in [*gm.parameters(), *gm.buffers()]}
        self.owner: dict[StorageWeakRef, str] = {}
        self.size: dict[StorageWeakRef, int] = {}
        self.alias: dict[StorageWeakRef, StorageWeakRef] = {}
        self.seen: set[StorageWeakRef] = set()
        self.saved: dict[str, int] = defaultdict(int)
        self.keep: list[torch.Tensor] = []  # storages stay alive, so their keys are never reused
        self.current = ""
        self.counter = flop_counter()
        self.memo: dict[Any, tuple[memo.Record, list[str]]] = {}  # key -> record, the ops DTensor lacks
        self.module_keys: dict[int, Any] = {}
        self.packs: list[tuple[Any, int, bool]] | None = None  # saved-tensor events of the call being recorded
        self.recorder: Any = contextlib.nullcontext()  # the ops of the call being measured (dtensor_reach)
        self.dtensor_lacks: dict[str, list[str]] = {}  # node name -> ops DTensor cannot run

    # ---- storage bookkeeping --------------------------------------------------------------
    def _key(self, tensor: torch.Tensor) -> StorageWeakRef:
        key = StorageWeakRef(tensor.untyped_storage())
        return self.alias.get(key, key)

    def _pack(self, tensor: torch.Tensor) -> torch.Tensor:
        key, nbytes = self._key(tensor), tensor.untyped_storage().nbytes()
        if self.packs is not None:
            self.packs.append((key, nbytes, key in self.seen))
        if self._charge(key, nbytes):
            self.keep.append(tensor)
        return tensor

    def _charge(self, key: Any, nbytes: int) -> bool:
        """Charge a saved storage once, to the node that produced it (else the current node)."""
        if key in self.frozen or key in self.seen:
            return False
        self.seen.add(key)
        owner = self.owner.get(key, self.current)
        self.saved[owner] += self.size.get(key, nbytes)
        return True

    def _register(self, name: str, outputs: list[torch.Tensor]) -> None:
        for tensor in outputs:
            key = self._key(tensor)
            if key not in self.owner and key not in self.frozen:
                self.owner[key] = name
                self.size[key] = tensor.untyped_storage().nbytes()
                self.keep.append(tensor)

    def _localize(self, value: Any) -> tuple[Any, list[torch.Tensor]]:
        """Private copies of the activations in ``value``; returns them and the tensors whose
        gradient the node computes: the copies' leaves, and views of parameters."""
        memo: dict[int, torch.Tensor] = {}
        leaves: list[torch.Tensor] = []

        def local(t: torch.Tensor) -> torch.Tensor:
            if StorageWeakRef(t.untyped_storage()) in self.frozen:
                if (t.grad_fn is not None or t.requires_grad) and all(t is not leaf for leaf in leaves):
                    leaves.append(t)  # a parameter or its view (w.T, w[e]) as an argument: its gradient is this node's
                return t
            if id(t) not in memo:
                if t.requires_grad:
                    memo[id(t)] = self._copy(t, leaves)
                else:
                    memo[id(t)] = t.detach()
            return memo[id(t)]

        return tree_map(lambda x: local(x) if isinstance(x, torch.Tensor) else x, value), leaves

    def _copy(self, t: torch.Tensor, leaves: list[torch.Tensor]) -> torch.Tensor:
        """A same-layout copy of ``t`` (size, strides, offset) on a fresh storage: a grad leaf,
        cloned once more so in-place ops on it are legal."""
        numel = t.untyped_storage().nbytes() // t.element_size()
        base = torch.empty(numel, dtype=t.dtype, device=t.device, requires_grad=True)
        leaves.append(base)
        copy = base.clone()
        self.alias[StorageWeakRef(copy.untyped_storage())] = self._key(t)
        self.keep.append(copy)
        return copy.as_strided(t.size(), t.stride(), t.storage_offset())

    # ---- running ----------------------------------------------------------------------------
    def measure(
        self,
        *,
        name: str,
        node: torch.fx.Node | None,
        fn,
        args: tuple,
        kwargs: dict,
        extra_params: list[torch.Tensor],
        module: torch.nn.Module | None = None,
    ) -> tuple[Any, int, int]:
        """Run ``fn`` on local copies, or replay an identical call (autoplan.trace.memo);
        return (output, forward FLOPs, backward FLOPs)."""
        self.current = name
        key, inputs = self._memo_key(node, module, args, kwargs, extra_params)
        hit = self.memo.get(key) if key is not None else None  # a key is a deep tuple: hashed once a call
        if hit is not None:
            rec, self.dtensor_lacks[name] = hit
            if rec.rerun:  # views of the parameters it takes, grad_fn included (memo.Record.rerun)
                output = fn(*args, **kwargs)
            else:
                output = memo.replay(rec, inputs, storage_key=self._key, charge=self._charge)
            self._register(name, _tensors(output))
            return output, rec.fwd_flops, rec.bwd_flops
        self.packs = [] if key is not None else None
        self.recorder = dtensor_reach.OpRecorder() if node is not None else contextlib.nullcontext()
        try:
            output, fwd, bwd = self._measure(fn, args, kwargs, extra_params)
        finally:
            packs, self.packs = self.packs, None
        if node is not None:
            self.dtensor_lacks[name] = dtensor_reach.lacking(list(self.recorder.ops))
        if key is not None:
            self._remember(key, output, inputs, packs, fwd, bwd, self.dtensor_lacks.get(name, []))
        self._register(name, _tensors(output))
        return output, fwd, bwd

    def _measure(self, fn, args: tuple, kwargs: dict, extra_params: list[torch.Tensor]) -> tuple[Any, int, int]:
        (largs, lkwargs), leaves = self._localize((args, kwargs))
        before = self.counter.get_total_flops()
        with torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t), self.recorder:
            output = fn(*largs, **lkwargs)
        fwd = self.counter.get_total_flops() - before
        tensors = _tensors(output)
        grads_of = [p for p in extra_params if p.requires_grad and all(p is not leaf for leaf in leaves)]
        with self.recorder:
            return output, fwd, self._backward(tensors, leaves + grads_of)

    def _memo_key(self, node, module, args, kwargs, extra_params) -> tuple[Any, list[torch.Tensor]]:
        if not MEMOIZE or node is None:
            return None, []
        try:
            return memo_keys.call_key(
                node,
                module,
                args,
                kwargs,
                extra_params,
                storage_key=self._key,
                frozen=self.frozen,
                module_keys=self.module_keys,
                hook_owner=getattr(self.counter, "mod_tracker", None),
            )
        except Exception:  # NotMemoizable, or anything unforeseen: measuring for real is always right
            return None, []

    def _remember(
        self, key: Any, output: Any, inputs: list[torch.Tensor], packs: list, fwd: int, bwd: int, lacks: list[str]
    ) -> None:
        try:
            rec = memo.record(
                output=output,
                leaves=inputs,
                packs=packs,
                fwd=fwd,
                bwd=bwd,
                storage_key=self._key,
                frozen=self.frozen,
                owner=self.owner,
            )
        except Exception:  # NotMemoizable, or anything unforeseen: this call is just not replayed
            return
        self.memo[key] = (rec, lacks)

    def _backward(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor]) -> int:
        outs = [t for t in outputs if t.requires_grad and t.grad_fn is not None]
        if not outs or not inputs:
            return 0
        before = self.counter.get_total_flops()
        torch.autograd.grad(outs, inputs, grad_outputs=[torch.empty_like(t) for t in outs], allow_unused=True)
        return self.counter.get_total_flops() - before

    def run_node(self, node: torch.fx.Node) -> Measured | None:
        if node.op == "get_attr":
            self.env[node] = _fake_constant(nodeattrs._get_attr(self.gm, node.target))
            return None
        if node.op == "call_module" and node.target == "_guards_fn":  # torch.export's input guards
            return None
        args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), lambda n: self.env.get(n))
        module = self.gm.get_submodule(node.target) if node.op == "call_module" else None
        params = nodeattrs.node_params(node, self.gm, module, self.canonical)
        try:
            output, fwd, bwd = self.measure(
                name=node.name,
                node=node,
                fn=self._callable(node, module),
                args=args,
                kwargs=kwargs,
                extra_params=[t for _, t in params],
                module=module,
            )
        except Exception as exc:
            raise self._failure(node, exc) from exc
        self.env[node] = output
        kind, attrs = nodeattrs.kind_and_attrs(node, module, args, kwargs, output, params)
        if module is None:  # an explicit cast's target, for the activations' run dtypes (trace/casts.py)
            attrs.update(casts.cast_attrs(node, classify.short_name(node), self.canonical))
        if mixes := sequence_mixing.mixed_sizes(classify.short_name(node), kind, args, kwargs, module):
            attrs["mixes"] = mixes  # the dims a shard of the sequence cannot combine alone (cp_refusal)
        if self.dtensor_lacks.get(node.name):  # tensor parallelism cannot run this node (dtensor_reach)
            attrs["dtensor_lacks"] = self.dtensor_lacks[node.name]
        if "module_type" in attrs and module is None and node.meta.get("nn_module_stack"):
            path, owner = list(node.meta["nn_module_stack"].values())[-1]
            attrs["module_type"] = _class_name(owner)
            if any(name.rpartition(".")[0] == path for name, _ in params):  # the module owns the weight it calls with
                splittable = _splittable(kind, owner)
                if splittable is not None:
                    attrs["tp_splittable"] = splittable
        return Measured(
            name=node.name,
            node=node,
            kind=kind,
            op_name=classify.short_name(node),
            target=_target_text(node, module),
            module=module_path(node),
            inputs=_input_names(node),
            params=[n for n, _ in params],
            outputs=_tensors(output),
            fwd_flops=int(fwd),
            bwd_flops=int(bwd),
            attrs=attrs,
        )

    def _callable(self, node: torch.fx.Node, module: torch.nn.Module | None):
        if module is not None:
            return module
        if node.op == "call_method":
            return lambda obj, *a, **k: getattr(obj, node.target)(*a, **k)
        return node.target

    def _failure(self, node: torch.fx.Node, exc: Exception) -> NodeFailure:
        from torch._subclasses.fake_tensor import DataDependentOutputException, DynamicOutputShapeException

        where = stack_trace_line(node.meta.get("stack_trace"))
        where = f" at {where}" if where else ""
        module = module_path(node) or "the top-level forward()"
        op = _target_text(node, self.gm.get_submodule(node.target) if node.op == "call_module" else None)
        if isinstance(exc, (DynamicOutputShapeException, DataDependentOutputException)):
            return NodeFailure(f"op '{op}' in module '{module}'{where} {data_dependent_hint(raised_in(exc))}")
        return NodeFailure(f"op '{op}' in module '{module}'{where} failed on fake tensors: {first_line(exc)}.")

    def placeholder(self, node: torch.fx.Node, value: Any) -> Measured:
        self.env[node] = value
        tensors = _tensors(value)
        self._register(node.name, tensors)
        return Measured(
            name=node.name,
            node=node,
            kind="input",
            op_name="input",
            target="input",
            module="",
            inputs=[],
            params=[],
            outputs=tensors,
        )

    def finish(self, records: list[Measured]) -> None:
        for record in records:
            record.saved_bytes = int(self.saved.get(record.name, 0))


def _fake_constant(value: Any) -> Any:
    """A tensor constant the graph holds outside parameters and buffers, as a FakeTensor (values are not needed)."""
    from torch._subclasses.fake_tensor import FakeTensor

    if isinstance(value, torch.Tensor) and not isinstance(value, FakeTensor):
        return torch.empty(tuple(value.shape), dtype=value.dtype, device="cpu")
    return value


def _splittable(kind: str, owner: Any) -> bool | None:
    """Whether the module a linear or embedding call sits in is one the executor can split
    (an nn.Linear, an nn.Embedding: autoplan/execute/tensor_parallel.py); None when unknown."""
    base = {"linear": torch.nn.Linear, "embedding": torch.nn.Embedding}.get(kind)
    if isinstance(owner, type):
        cls = owner
    else:  # torch.export names the class ('transformers.pytorch_utils.Conv1D'); fx hands the class itself
        import pydoc  # 14 ms, only for the exporter's names

        cls = pydoc.locate(str(owner))
    return issubclass(cls, base) if base is not None and isinstance(cls, type) else None


def _class_name(module_type: Any) -> str:
    """'Conv1D' from a class or from torch.export's 'transformers.pytorch_utils.Conv1D' string."""
    return module_type.__name__ if isinstance(module_type, type) else str(module_type).rsplit(".", 1)[-1]


def _tensors(value: Any) -> list[torch.Tensor]:
    return [t for t in tree_leaves(value) if isinstance(t, torch.Tensor)]


def _input_names(node: torch.fx.Node) -> list[str]:
    names = []
    for arg in node.all_input_nodes:
        if arg.op != "get_attr" and arg.name not in names:
            names.append(arg.name)
    return names


def _target_text(node: torch.fx.Node, module: torch.nn.Module | None) -> str:
    from autoplan.trace.classify import target_text

    return target_text(node, module)
