"""Turn measured records into autoplan's :class:`Graph`."""

from __future__ import annotations

import dataclasses
from collections import Counter

import torch

from autoplan.trace import layers as layers_mod
from autoplan.trace.propagate import Measured
from autoplan.trace.tensors import dtype_name, nbytes
from autoplan.types.graph import Graph, OpNode, ParamInfo


def parameter_table(model: torch.nn.Module) -> dict[str, ParamInfo]:
    """Each distinct parameter once, under its first FQN (shapes and ``requires_grad``: works on meta)."""
    return {
        name: ParamInfo(
            shape=list(p.shape), dtype=dtype_name(p.dtype), numel=p.numel(), bytes=nbytes(p), trainable=p.requires_grad
        )
        for name, p in model.named_parameters()
    }


def _mark_sparse_grads(params: dict[str, ParamInfo], nodes: list[OpNode]) -> dict[str, ParamInfo]:
    """``sparse_grad`` on each table an embedding node reads with ``sparse=True`` (nn.Embedding,
    nn.EmbeddingBag, F.embedding); a table read densely anywhere else gets a dense gradient."""
    sparse = {p for n in nodes if n.op == "embedding" and n.attrs.get("sparse") for p in n.param_names}
    dense = {p for n in nodes if not (n.op == "embedding" and n.attrs.get("sparse")) for p in n.param_names}
    return {
        name: dataclasses.replace(info, sparse_grad=True) if name in sparse - dense else info
        for name, info in params.items()
    }


def canonical_names(model: torch.nn.Module) -> dict[str, str]:
    """Every FQN of every parameter -> the first FQN of that tensor (ties share one name)."""
    first: dict[int, str] = {}
    names: dict[str, str] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        names[name] = first.setdefault(id(p), name)
    return names


def seq_len_of(inputs: tuple) -> int | None:
    """Tokens per sample: the second dim of the first integer [B, S] input."""
    for value in inputs:
        if (
            isinstance(value, torch.Tensor)
            and value.dim() == 2
            and not value.is_floating_point()
            and value.dtype != torch.bool
        ):
            return int(value.shape[1])
    return None


def _op_node(record: Measured, layer: str | None, params: dict[str, ParamInfo]) -> OpNode:
    infos = [params[p] for p in record.params if p in params]
    first = record.outputs[0] if record.outputs else None
    attrs = dict(record.attrs)
    if len(record.outputs) > 1:
        attrs["output_shapes"] = [list(map(int, t.shape)) for t in record.outputs]
    return OpNode(
        name=record.name,
        op=record.kind,
        target=record.target,
        module=record.module,
        layer=layer,
        param_names=list(record.params),
        param_count=sum(i.numel for i in infos),
        param_bytes=sum(i.bytes for i in infos),
        param_dtype=infos[0].dtype if infos else None,
        output_shape=list(map(int, first.shape)) if first is not None else [],
        output_dtype=dtype_name(first.dtype) if first is not None else "",
        output_bytes=sum(nbytes(t) for t in record.outputs),
        saved_bytes=record.saved_bytes,
        fwd_flops=record.fwd_flops,
        bwd_flops=record.bwd_flops,
        attrs=attrs,
    )


def build_graph(
    records: list[Measured],
    *,
    model: torch.nn.Module,
    model_name: str,
    batch_size: int,
    trace_method: str,
    seq_len: int | None,
) -> Graph:
    params = parameter_table(model)
    layer_of = layers_mod.assign_layers(records, layers_mod.find_blocks(model, records))
    order = layers_mod.execution_order(records, layer_of)
    groups = layers_mod.group_layers(records, layer_of, order, {k: v.shape for k, v in params.items()})
    nodes = [_op_node(r, layer_of[r.name], params) for r in records]
    params = _mark_sparse_grads(params, nodes)
    names = {n.name for n in nodes}
    edges = [(src, r.name) for r in records for src in r.inputs if src in names]
    dtypes = Counter(info.dtype for info in params.values())
    return Graph(
        model_name=model_name,
        batch_size=batch_size,
        trace_method=trace_method,
        nodes=nodes,
        edges=edges,
        layers=order,
        groups=groups,
        parameters=params,
        seq_len=seq_len,
        dtype=dtypes.most_common(1)[0][0] if dtypes else "float32",
        buffer_bytes=sum(b.numel() * b.element_size() for b in model.buffers()),
        buffer_dtypes=len({b.dtype for b in model.buffers()}),
    )
