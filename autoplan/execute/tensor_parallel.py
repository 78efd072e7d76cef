"""Tensor (and sequence) parallelism from ``plan.tp_plan``, for any model code (docs/executor.md,
"Tensor parallelism: how any model code runs correctly").

*DTensor everywhere inside the tp region*: every parameter of a tensor-parallel module is a
DTensor on the tp mesh, activations leaving a split module stay DTensors
(``use_local_output=False``), plain tensors met on the way are ``Replicate`` under
``implicit_replication``, and model outputs become full tensors before the loss. Per split (``W`` a
Linear weight ``[out, in]``):

- ``colwise``: ``W``, bias -> ``Shard(0)``; input -> ``Replicate`` (all-gather under SP); output
  ``Shard(-1)``. Embedding: ``W [vocab, dim]`` -> ``Shard(1)``, output all-gathered to the stream
  layout (``Replicate``, or ``Shard(1)`` under SP), as autoplan.cost.tp.splits prices it.
- ``rowwise``: ``W`` -> ``Shard(1)``, bias ``Replicate``; input -> ``Shard(-1)``; output partial
  sums -> ``Replicate`` (all-reduce) or ``Shard(1)`` (reduce-scatter) under SP. Embedding: ``W`` ->
  ``Shard(0)`` (vocabulary), output all-reduced / reduce-scattered.
- ``sequence_parallel``: parameters ``Replicate``; input -> ``Shard(1)``; output stays so.
- ``replicate`` (a Linear the plan does not split, outside MoE blocks): parameters ``Replicate``; input ->
  ``Replicate`` (the all-gather a colwise sibling shares under SP); output kept and settled, so its
  gradient comes back whole. Left to DTensor, a replicated linear would run on whatever shard its
  input or its output's gradient arrives in (LoRA's adapters on the sequence shard), which the cost
  model does not price (autoplan/cost/tp/splits.py).

An FP8 linear keeps these placements, with torchao's ``Float8ColwiseParallel`` /
``Float8RowwiseParallel`` casts (autoplan/execute/float8.py).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor
from torch.utils.weak import WeakIdKeyDictionary

from autoplan.errors import PlanError
from autoplan.execute import dtensor_handlers, float8  # noqa: F401  (view and in-place handlers)
from autoplan.trace import dtensor_rules  # noqa: F401  (CPU attention sharding)
from autoplan.types.plan import Plan

SEQ_DIM = 1
PARAM_PLACEMENTS = {  # (kind, split) -> {param name: placement}
    ("linear", "colwise"): {"weight": Shard(0), "bias": Shard(0)},
    ("linear", "rowwise"): {"weight": Shard(1), "bias": Replicate()},
    ("embedding", "colwise"): {"weight": Shard(1)},
    ("embedding", "rowwise"): {"weight": Shard(0)},
}


def module_kind(module: nn.Module) -> str:
    """'linear', 'embedding' or 'other': what a split may be applied to."""
    if isinstance(module, nn.Linear):
        return "linear"
    if isinstance(module, nn.Embedding):
        return "embedding"
    return "other"


def validate_tp_plan(*, model: nn.Module, plan: Plan) -> dict[str, str]:
    """Check every split names a module that can take it; return {fqn: kind}.

    Raises PlanError for a module that does not exist, a colwise/rowwise split of something
    that is not a Linear or Embedding, or a sharded dim that the tp degree does not divide."""
    modules = dict(model.named_modules())
    kinds = {}
    for fqn, split in plan.tp_plan.items():
        if fqn not in modules:
            raise PlanError(
                f"plan tp_plan names module '{fqn}', which the model does not have; re-plan for this model."
            )
        kinds[fqn] = module_kind(modules[fqn])
        if plan.tp > 1 and split in ("colwise", "rowwise"):
            _check_splittable(fqn=fqn, module=modules[fqn], kind=kinds[fqn], split=split, tp=plan.tp)
    return kinds


def _check_splittable(*, fqn: str, module: nn.Module, kind: str, split: str, tp: int) -> None:
    if kind == "other":
        raise PlanError(
            f"plan tp_plan['{fqn}']='{split}' but {fqn} is a {type(module).__name__}; "
            "only nn.Linear and nn.Embedding can be split colwise/rowwise."
        )
    weight = module.weight
    dim = PARAM_PLACEMENTS[(kind, split)]["weight"].dim
    if weight.shape[dim] % tp:
        raise PlanError(
            f"plan tp_plan['{fqn}']='{split}' shards a dim of size {weight.shape[dim]}, "
            f"which tp={tp} does not divide; pick a tp degree that divides it."
        )


def apply_tensor_parallel(
    *, module: nn.Module, plan: Plan, tp_mesh: DeviceMesh, kinds: dict[str, str], moe: tuple[str, ...] = ()
) -> nn.Module:
    """Shard ``module`` (the whole model or one pipeline stage) in place over ``tp_mesh``; the modules
    under ``moe`` (MoE blocks, which run whole on the rank's tokens: expert_sequence.py) are left as they are."""
    if plan.tp == 1:
        return module
    present = dict(module.named_modules())
    splits = {fqn: split for fqn, split in plan.tp_plan.items() if fqn in present and split != "replicate"}
    _distribute_parameters(module, splits=splits, kinds=kinds, mesh=tp_mesh)
    inputs = SharedInputs(tp_mesh)
    for fqn, split in splits.items():
        if plan.sequence_parallel:  # first: these hooks see what the redistributions below receive
            _check_even_sequences(present[fqn], fqn=fqn, split=split, kind=kinds[fqn], tp=plan.tp)
        _add_hooks(present[fqn], split=split, kind=kinds[fqn], mesh=tp_mesh, sp=plan.sequence_parallel, inputs=inputs)
    for fqn in _replicated(present, splits=splits, moe=moe):
        _whole_weights_while_called(present[fqn])  # a weight tied to a split module's: whole for this call
        present[fqn].register_forward_pre_hook(lambda _m, args: tuple(inputs(a, Replicate()) for a in args))
        present[fqn].register_forward_hook(lambda _m, _args, out: _settled(out) if isinstance(out, DTensor) else out)
    # Enter as DTensors, leave as full plain tensors: then the gradient a pipeline stage
    # sends back for its input is a plain tensor too, and the loss sees plain outputs.
    sp = plan.sequence_parallel
    module.register_forward_pre_hook(lambda _m, args: tuple(_entering(a, tp_mesh, sp=sp) for a in args))
    module.register_forward_hook(lambda _m, _args, output: to_full(output))
    return module


def _whole_weights_while_called(module: nn.Module) -> None:
    """A replicated linear whose weight is tied to a split module's (Hugging Face Mamba's ``lm_head`` to the colwise
    embedding's ``Shard(1)`` table) computes with that weight redistributed to ``Replicate`` for each call, which
    autograd sends back to the shard. Left on the shard, DTensor's matmul gave every gradient of the model twice its
    value (tp = 2, all of them: the logits' gradient entered the stream doubled)."""
    sharded = [name for name, p in module.named_parameters(recurse=False) if _split_dtensor(p)]
    if not sharded:
        return
    kept: dict[str, nn.Parameter] = {}

    def swap_in(mod: nn.Module, _args: tuple) -> None:
        for name in sharded:
            param = kept[name] = mod._parameters[name]
            mod._parameters[name] = param.redistribute(param.device_mesh, [Replicate()] * param.device_mesh.ndim)

    def swap_back(mod: nn.Module, _args: tuple, _output: Any) -> None:
        mod._parameters.update(kept)

    module.register_forward_pre_hook(swap_in)
    module.register_forward_hook(swap_back, always_call=True)


def _split_dtensor(x: Any) -> bool:
    return isinstance(x, DTensor) and not all(p.is_replicate() for p in x.placements)


def _replicated(present: dict[str, nn.Module], *, splits: dict[str, str], moe: tuple[str, ...]) -> list[str]:
    """The Linears the plan does not split (named ``replicate`` or not named, as the cost model reads a
    tp_plan) outside the MoE blocks: each takes its input whole, as the cost model prices a replicated
    linear (input R, output R, its gradient R: cost/tp/splits.py ``settled``). A replicated Embedding is
    left to DTensor: its integer input is whole anyway, and on the SP stream its gradient is partial."""
    return [
        fqn
        for fqn, sub in present.items()
        if fqn
        and fqn not in splits
        and module_kind(sub) == "linear"
        and not any(fqn == block or fqn.startswith(f"{block}.") for block in moe)
    ]


def _entering(x: Any, mesh: DeviceMesh, *, sp: bool) -> Any:
    """A plain floating input as a full (Replicate) DTensor. Under SP an activation that needs a
    gradient (what a pipeline stage receives: the residual stream) is cut to its sequence shard
    at once and settled there, so its gradient is all-gathered once, when the stage sends it
    back, however many of its consumers run on the shard (the cost model's pp_comm term)."""
    if not isinstance(x, torch.Tensor) or isinstance(x, DTensor) or not x.is_floating_point():
        return x
    full = DTensor.from_local(x, mesh, [Replicate()], run_check=False)
    if sp and x.requires_grad and x.dim() >= 3 and x.shape[SEQ_DIM] % mesh.size() == 0:
        return _settled(full.redistribute(mesh, [Shard(SEQ_DIM)]))
    return full


def _distribute_parameters(
    module: nn.Module, *, splits: dict[str, str], kinds: dict[str, str], mesh: DeviceMesh
) -> None:
    """Make every parameter a DTensor on the tp mesh: split ones sharded, the rest Replicate
    (so one optimizer and one gradient rule, :func:`finalize_tp_grads`, cover them all).

    A parameter shared by several modules (tied embeddings) becomes one DTensor set on all of
    them; its placement is the split one if any user is split (DTensor semantics make every
    other user compute the same numbers), and two different splits are a PlanError."""
    users: dict[int, list[tuple[str, nn.Module, str, nn.Parameter]]] = {}
    for fqn, sub in module.named_modules(remove_duplicate=False):
        for name, param in sub.named_parameters(recurse=False):
            users.setdefault(id(param), []).append((fqn, sub, name, param))
    for group in users.values():
        param = group[0][3]
        if isinstance(param, DTensor):  # already laid out on its own mesh: a folded layout's experts
            continue
        placement = _placement_of(group, splits=splits, kinds=kinds)
        shared = nn.Parameter(distribute_tensor(param.data, mesh, [placement]), param.requires_grad)
        for _fqn, sub, name, _param in group:
            sub.register_parameter(name, shared)


def _placement_of(group: list, *, splits: dict[str, str], kinds: dict[str, str]) -> Any:
    chosen: dict[str, Any] = {}
    for fqn, _sub, name, _param in group:
        if fqn in splits:
            chosen[fqn] = PARAM_PLACEMENTS.get((kinds[fqn], splits[fqn]), {}).get(name, Replicate())
    distinct = set(map(repr, chosen.values()))
    if len(distinct) > 1:
        names = ", ".join(f"{fqn}={splits[fqn]}" for fqn in chosen)
        raise PlanError(
            f"tied parameter '{group[0][0]}.{group[0][2]}' gets different shardings from its users ({names}); "
            "give tied modules matching splits."
        )
    return next(iter(chosen.values())) if chosen else Replicate()


class SharedInputs:
    """A split module's input, brought to the placement it needs once per tensor and placement,
    however many split modules read it (q, k and v projections of one normed stream), and
    settled (:func:`_settled`): its gradient is reduced to that placement right there, once.

    This is the cost model's "any-of" term (autoplan/cost/tp/splits.py): one all-gather
    of a sequence-sharded input under SP and one reduction of its gradient, not one per
    consumer; and a partial gradient never leaks into the norm before it (whose weight
    gradient would then need a reduction of its own). Entries live as long as the input tensor
    and are kept apart per autograd pass, so a recomputed forward redistributes anew, and per grad
    mode, so a linear run under ``torch.no_grad()`` leaves the others an input with its graph."""

    def __init__(self, mesh: DeviceMesh):
        self.mesh = mesh
        self.done: WeakIdKeyDictionary = WeakIdKeyDictionary()

    @torch.compiler.disable  # in a compiled block (execute/compiled.py) it runs eagerly: dynamo cannot trace
    def __call__(self, x: Any, placement: Any, *, fp8: tuple[nn.Module, str] | None = None) -> Any:  # its memo
        """``x`` in ``placement``; with ``fp8`` (a converted linear and its split) cast to fp8
        before the redistribution (autoplan/execute/float8.py), shared by every fp8 consumer."""
        if not isinstance(x, torch.Tensor) or not x.is_floating_point():
            return _redistribute(x, self.mesh, placement)
        seen = self.done.setdefault(x, {})
        # grad mode too: a linear under torch.no_grad() reading the input first left a copy without a graph, which
        # the next linear took, and its path sent x no gradient (30-47% off under a pinned tp)
        key = (repr(placement), torch._C._current_graph_task_id(), fp8 is not None, torch.is_grad_enabled())
        if key not in seen:  # settle in the placement it arrives in, then redistribute: under SP the
            # gradient of the all-gather is reduce-scattered back to the sequence shard
            arrived = x.placements[0] if isinstance(x, DTensor) else Replicate()
            settled = _settled(_redistribute(x, self.mesh, arrived))
            if fp8 is None:
                seen[key] = _redistribute(settled, self.mesh, placement)
            else:
                placement = _normalized(placement, settled.dim())
                seen[key] = float8.tp_input(module=fp8[0], split=fp8[1], x=settled, placement=placement, mesh=self.mesh)
        return seen[key]


def _check_even_sequences(module: nn.Module, *, fqn: str, split: str, kind: str, tp: int) -> None:
    """Raise PlanError where sequence parallelism would shard a sequence that tp does not divide
    (the input of a ``sequence_parallel`` module, the output of a rowwise one): DTensor pads such a
    shard's collectives past the price and cannot view a sequence of one position on two ranks. The
    planner never offers it (autoplan/solve/sequence_parallel.py); a hand-written plan gets this."""
    want_in, want_out = _layouts(split=split, kind=kind, sp=True)

    def check(what: str, *values: Any) -> None:
        for x in values:
            if isinstance(x, torch.Tensor) and x.is_floating_point() and x.dim() >= 3 and x.shape[SEQ_DIM] % tp:
                raise PlanError(
                    f"plan sequence_parallel shards the sequence of {fqn}'s {what} ({x.shape[SEQ_DIM]} positions) "
                    f"over tp={tp}, which does not divide it; plan sp=off or a tp that divides every sequence length."
                )

    if want_in == Shard(SEQ_DIM):
        module.register_forward_pre_hook(lambda _m, args: check("input", *args))
    if want_out == Shard(SEQ_DIM):
        module.register_forward_hook(lambda _m, _args, out: check("output", out))


def sequence_dim(x: torch.Tensor) -> int:
    """Where sequence parallelism shards ``x``: dim 1 of [batch, seq, ...], dim 0 of an unbatched [seq, hidden]
    output (nanoGPT's position embedding ``wpe(arange(t))``, broadcast over the batch). Dim 1 of the latter is
    its hidden size, which the stream's sequence shard would all-gather to broadcast against, in the forward
    and again in the backward: the cost model's sequence shard (Q) is the sequence (cost/tp/shards.py)."""
    return SEQ_DIM if x.dim() >= 3 else 0


def _out_placement(want: Any, out: Any, tp: int) -> Any:
    """``want`` for a module output ``out``: SP's sequence shard on ``out``'s sequence (:func:`sequence_dim`). A 2-D
    output whose dim 0 tp does not divide keeps ``want``: it is no sequence the stream shards (the stream's own
    sequence is checked, :func:`_check_even_sequences`), e.g. a [batch, features] head at a micro-batch of 1."""
    if want == Shard(SEQ_DIM) and isinstance(out, torch.Tensor) and out.dim() == 2 and out.shape[0] % tp == 0:
        return Shard(sequence_dim(out))
    return want


def _add_hooks(module: nn.Module, *, split: str, kind: str, mesh: DeviceMesh, sp: bool, inputs: SharedInputs) -> None:
    want_in, want_out = _layouts(split=split, kind=kind, sp=sp)
    if float8.is_float8(module):  # fp8 casts before the redistributions (torchao's float8 TP styles)
        _add_float8_hooks(module, split=split, mesh=mesh, inputs=inputs, want_in=want_in, want_out=want_out)
        return
    module.register_forward_pre_hook(lambda _m, args: tuple(inputs(a, want_in) for a in args))
    if want_out is not None:
        module.register_forward_hook(
            lambda _m, _args, out: _settled(_redistribute(out, mesh, _out_placement(want_out, out, mesh.size())))
        )
    else:  # a colwise output keeps its shard, and so does its gradient: when model code gathers the output
        # (a fused qkv split by global sizes), the weight gradient is still computed on the local shard only
        module.register_forward_hook(lambda _m, _args, out: _settled(out) if isinstance(out, DTensor) else out)


def _add_float8_hooks(
    module: nn.Module, *, split: str, mesh: DeviceMesh, inputs: SharedInputs, want_in: Any, want_out: Any
) -> None:
    """A converted linear's hooks: its input cast to fp8, then brought to ``want_in``; its output
    brought to ``want_out`` (None: kept) with its gradient cast to fp8 (autoplan/execute/float8.py)."""
    fp8 = (module, split)
    module.register_forward_pre_hook(lambda _m, args: tuple(inputs(a, want_in, fp8=fp8) for a in args))
    module.register_forward_hook(
        lambda m, _args, out: _settled(
            float8.tp_output(
                module=m, split=split, out=out, placement=_out_placement(want_out, out, mesh.size()), mesh=mesh
            )
        )
    )


def _normalized(placement: Any, ndim: int) -> Any:
    """``Shard(-k)`` as ``Shard(ndim - k)``; any other placement unchanged."""
    return Shard(placement.dim + ndim) if isinstance(placement, Shard) and placement.dim < 0 else placement


def _layouts(*, split: str, kind: str, sp: bool) -> tuple[Any, Any]:
    """(input placement, output placement or None to keep) for one split."""
    seq_out = Shard(SEQ_DIM) if sp else Replicate()
    if split == "colwise":  # an Embedding's output is the residual stream: gathered (the cost model's sink)
        return Replicate(), (seq_out if kind == "embedding" else None)
    if split == "rowwise":
        return (Replicate() if kind == "embedding" else Shard(-1)), seq_out
    return Shard(SEQ_DIM), None  # sequence_parallel


def _redistribute(x: Any, mesh: DeviceMesh, placement: Any) -> Any:
    """``x`` as a DTensor with ``placement``; a plain tensor is a full (replicated) value."""
    if not isinstance(x, torch.Tensor):
        return x
    if not isinstance(x, DTensor):
        x = DTensor.from_local(x, mesh, [Replicate()], run_check=False)
    placement = _normalized(placement, x.dim())
    return x if tuple(x.placements) == (placement,) else x.redistribute(mesh, [placement])


def _settled(x: DTensor) -> DTensor:
    """``x`` unchanged in forward; in backward its gradient is brought to ``x``'s placement
    before it reaches the redistribution that made ``x``. Downstream DTensor ops may leave
    that gradient as a partial sum, and a partial sum cannot be redistributed to every
    placement (e.g. the masked partial of a vocabulary-sharded embedding). This is where
    Megatron's all-reduce of the input gradient of a column-parallel layer happens.

    The global shape and stride are passed on, not inferred from the local shard: a sequence
    that tp does not divide (a 7-token decoder at tp=2) has shards of 4 and 3 positions, and
    ``from_local`` would take each rank's shard times tp as the whole (8 on one rank, 6 on the
    other), so the next all-gather mismatches or the result has the wrong length."""
    placements = tuple(x.placements)
    local = x.to_local(grad_placements=placements)
    return DTensor.from_local(local, x.device_mesh, placements, run_check=False, shape=x.shape, stride=x.stride())


def to_full(obj: Any) -> Any:
    """``obj`` with every DTensor replaced by its full plain tensor (differentiably)."""
    if isinstance(obj, DTensor):
        return obj.full_tensor()
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return type(obj)(*(to_full(o) for o in obj))
    if isinstance(obj, (tuple, list)):
        return type(obj)(to_full(o) for o in obj)
    if isinstance(obj, dict):
        return type(obj)((k, to_full(v)) for k, v in obj.items()) if type(obj) is dict else _to_full_mapping(obj)
    return obj


def _to_full_mapping(obj: Any) -> Any:
    for key in list(obj.keys()):
        obj[key] = to_full(obj[key])
    return obj


def finalize_tp_grads(params: list[nn.Parameter]) -> None:
    """Bring each gradient to its parameter's placements.

    A replicated weight used on a sequence shard (or any weight whose backward DTensor
    leaves as a partial sum) gets a ``Partial`` gradient; the optimizer needs it reduced.
    """
    for param in params:
        grad = param.grad
        if (
            isinstance(grad, DTensor)
            and isinstance(param, DTensor)
            and tuple(grad.placements) != tuple(param.placements)
        ):
            param.grad = grad.redistribute(param.device_mesh, param.placements)
