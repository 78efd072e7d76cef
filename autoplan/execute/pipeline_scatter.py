"""Pipeline sends under TP, scatter/gather: each tp rank sends 1/tp of a boundary tensor, and the
receiving stage all-gathers it over the tp group (Narayanan et al. SC'21 section 4.1; Megatron-LM's
scatter_gather_tensors_in_pipeline). Under sequence parallelism a tensor split along the sequence
stays so on arrival, as the receiving blocks take the residual stream; nothing is gathered
(docs/executor.md, "Pipeline parallelism"; priced in autoplan/cost/pp/messages.py).

Which tensors are split, and along which dim, is one rule on the tensor's whole shape
(``types/layout.pipeline_scatter_dim``), read here from the shapes ``torch.export`` recorded for
each boundary (:func:`boundary_specs`), so sender and receiver agree without sending metadata. The
sender's hook cuts its DTensor output to its shard (``redistribute`` to ``Shard(d)``, no
communication from a replicated or already sharded tensor; in backward the gradient shards it
receives are all-gathered); the receiver's hook rebuilds the DTensor from the shard and
all-gathers it (in backward its gradient is cut to the shard it sends back).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.fx as fx
import torch.nn as nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, Shard

from autoplan.types.layout import kept_sharded, pipeline_scatter_dim
from autoplan.types.plan import Plan

#: one boundary tensor as export recorded it: (whole shape, floating), or None (not a tensor)
TensorSpec = tuple[tuple[int, ...], bool] | None


def boundary_specs(stage_modules: list[fx.GraphModule], model_inputs: list[Any]) -> list[list[TensorSpec]]:
    """Per chunk but the last, what it sends the next one, in the order of its outputs. A stage's
    own outputs carry export's ``val``; a value it passes through is read from what it received,
    which is the previous chunk's outputs in order (the first chunk's: ``model_inputs``)."""
    received, found = [_spec_of_value(v) for v in model_inputs], []
    for module in stage_modules[:-1]:
        placeholders = [n for n in module.graph.nodes if n.op == "placeholder"]
        by_placeholder = dict(zip(placeholders, received))
        outputs = module.graph.output_node().args[0]
        flat = list(outputs) if isinstance(outputs, (tuple, list)) else [outputs]
        received = [by_placeholder[v] if v in by_placeholder else _spec_of_node(v) for v in map(_unwrapped, flat)]
        found.append(received)
    return found


def _unwrapped(node: Any) -> Any:
    """The value behind ``send_contiguous``'s ``contiguous()`` and ``send_contiguous_grads``'s
    ``contiguous_grad`` (autoplan/execute/stage_outputs.py): a received value a chunk passes on is its placeholder."""
    from autoplan.execute.stage_outputs import contiguous_grad

    while isinstance(node, fx.Node) and (
        (node.op == "call_method" and node.target == "contiguous")
        or (node.op == "call_function" and node.target is contiguous_grad)
    ):
        node = node.args[0]
    return node


def _spec_of_node(node: Any) -> TensorSpec:
    return _spec_of_value(node.meta.get("val")) if isinstance(node, fx.Node) else None


def _spec_of_value(value: Any) -> TensorSpec:
    if not isinstance(value, torch.Tensor):
        return None
    return tuple(int(d) for d in value.shape), value.is_floating_point()


def apply_pipeline_scatter(
    *,
    module: nn.Module,
    plan: Plan,
    tp_mesh: DeviceMesh,
    received: list[TensorSpec] | None,
    sent: list[TensorSpec] | None,
) -> None:
    """Cut what ``module`` (one pipeline chunk, tensor-parallel already) sends to its tp rank's
    shard, and gather what it receives (module docstring). ``received``: the specs of its inputs
    (None on the first chunk); ``sent``: of its outputs (None on the last). Both hooks go first, so
    TP's entry and exit hooks (tensor_parallel.py) see the gathered inputs and the cut outputs."""
    if plan.pp == 1 or plan.tp == 1:
        return
    sp = plan.sequence_parallel
    if received is not None:
        dims = [_dim(spec, plan) for spec in received]
        module.register_forward_pre_hook(
            lambda _m, args: tuple(_gathered(a, d, tp_mesh, sp=sp) for a, d in zip(args, dims)), prepend=True
        )
    if sent is not None:
        dims_out = [_dim(spec, plan) for spec in sent]
        module.register_forward_hook(lambda _m, _args, out: _cut_all(out, dims_out, tp_mesh), prepend=True)


def _dim(spec: TensorSpec, plan: Plan) -> int | None:
    if spec is None:
        return None
    shape, floating = spec
    return pipeline_scatter_dim(shape, floating=floating, tp=plan.tp, sequence_parallel=plan.sequence_parallel)


def _gathered(x: Any, dim: int | None, mesh: DeviceMesh, *, sp: bool) -> Any:
    """The DTensor whose local shard ``x`` is; all-gathered unless it stays split (a sequence
    shard under SP that needs a gradient, as tensor_parallel._entering would cut it). Its
    gradient leaves as this rank's shard (``from_local``'s backward)."""
    if dim is None or not isinstance(x, torch.Tensor) or isinstance(x, DTensor):
        return x
    whole = list(x.shape)
    whole[dim] *= mesh.size()
    stride = torch.empty(whole, device="meta").stride()
    shard = DTensor.from_local(x, mesh, [Shard(dim)], run_check=False, shape=torch.Size(whole), stride=stride)
    if kept_sharded(dim, sequence_parallel=sp) and x.requires_grad:
        return shard
    return shard.redistribute(mesh, [Replicate()])


def _cut_all(output: Any, dims: list[int | None], mesh: DeviceMesh) -> Any:
    flat = list(output) if isinstance(output, (tuple, list)) else [output]
    cut = [_cut(x, d, mesh) for x, d in zip(flat, dims)] + flat[len(dims) :]
    return type(output)(cut) if isinstance(output, (tuple, list)) else cut[0]


def _cut(x: Any, dim: int | None, mesh: DeviceMesh) -> Any:
    """This tp rank's shard of ``x`` along ``dim``, as a plain contiguous tensor; in backward the
    gradient shards are all-gathered (the redistribution's backward), or kept where ``x`` was split so."""
    if dim is None or not isinstance(x, torch.Tensor):
        return x
    if not isinstance(x, DTensor):
        x = DTensor.from_local(x, mesh, [Replicate()], run_check=False)
    if tuple(x.placements) != (Shard(dim),):
        x = x.redistribute(mesh, [Shard(dim)])
    return x.to_local(grad_placements=(Shard(dim),)).contiguous()
