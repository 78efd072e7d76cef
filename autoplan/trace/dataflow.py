"""Dataflow facts the tensor-parallel legality check needs, read off the traced graph.

- **Attention roles.** From each attention node's query, key and value arguments, walk the
  graph backwards through view and elementwise nodes (reshapes, transposes, splits, rotary
  embeddings, repeat_kv) and stop at the first node of any other kind. Each linear reached
  gets ``attrs["attention"] = {"roles": [...], "num_heads", "num_kv_heads", "head_dim", "node"}``.
  A fused qkv projection is reached from all three arguments: ``roles == ["q", "k", "v"]``.
  The attention node's ``num_kv_heads`` is then read from the key projection's width (so a
  model that repeats k/v heads before SDPA still reports its real kv heads); the head count
  SDPA itself saw stays in ``num_kv_heads_at_call``.
- **Fused chunks.** A linear whose output reaches, through view nodes only, a split/chunk/
  unbind along its feature dimension gets ``attrs["fused_chunks"]`` = the number of parts.
- **Experts.** A ModuleList/ModuleDict of two or more children that run on parallel paths (no
  child's output reaches another child) is a mixture-of-experts expert list (or parallel
  branches); each linear inside child ``i`` gets ``attrs["num_experts"]`` and ``attrs["expert"] = i``.
  Blocks run in sequence, so a list of transformer layers never qualifies.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Iterable

import torch

from autoplan.trace.classify import is_split
from autoplan.trace.propagate import Measured

_TRANSPARENT = ("view", "elementwise")
_ROLES = ("q", "k", "v")


def annotate(records: list[Measured], model: torch.nn.Module) -> None:
    by_name = {r.name: r for r in records}
    annotate_attention(records, by_name)
    annotate_fused_chunks(records, by_name)
    annotate_heads(records, by_name)
    annotate_experts(records, model)


# ---- attention roles ------------------------------------------------------------------
def _reach_back(start: str, by_name: dict[str, Measured], limit: int = 256) -> list[Measured]:
    """Linears reached backwards from ``start`` through transparent nodes."""
    found, queue, seen = [], deque([start]), {start}
    while queue and len(seen) < limit:
        record = by_name.get(queue.popleft())
        if record is None:
            continue
        if record.kind == "linear":
            found.append(record)
            continue
        if record.kind in _TRANSPARENT:
            for name in record.inputs:  # tensors only: a reshape's size arguments lead into the residual stream
                if name not in seen and by_name.get(name) is not None and by_name[name].outputs:
                    seen.add(name)
                    queue.append(name)
    return found


def annotate_attention(records: list[Measured], by_name: dict[str, Measured]) -> None:
    for att in (r for r in records if r.kind == "attention" and r.node is not None and r.node.op != "call_module"):
        roles: dict[str, list[str]] = {}
        for role, arg in zip(_ROLES, att.node.args[:3]):
            for linear in _reach_back(getattr(arg, "name", ""), by_name):
                roles.setdefault(linear.name, []).append(role)
        _fix_kv_heads(att, roles, by_name)
        for name, linear_roles in roles.items():
            by_name[name].attrs["attention"] = {
                "roles": linear_roles,
                "num_heads": att.attrs["num_heads"],
                "num_kv_heads": att.attrs["num_kv_heads"],
                "head_dim": att.attrs["head_dim"],
                "node": att.name,
            }


def _fix_kv_heads(att: Measured, roles: dict[str, list[str]], by_name: dict[str, Measured]) -> None:
    att.attrs["num_kv_heads_at_call"] = att.attrs["num_kv_heads"]
    key = [name for name, rs in roles.items() if "k" in rs]
    if len(key) != 1:
        return
    linear, head_dim, heads = by_name[key[0]], att.attrs["head_dim"], att.attrs["num_heads"]
    width = linear.attrs["out_features"]
    if "q" in roles[key[0]]:  # fused [q | k | v]: q takes heads*head_dim, k and v share the rest
        width = (width - heads * head_dim) // 2 if "v" in roles[key[0]] else width - heads * head_dim
    if width > 0 and width % head_dim == 0 and heads % (width // head_dim) == 0:
        att.attrs["num_kv_heads"] = width // head_dim


# ---- fused chunks -----------------------------------------------------------------------
def annotate_fused_chunks(records: list[Measured], by_name: dict[str, Measured]) -> None:
    consumers: dict[str, list[str]] = {}
    for record in records:
        for name in record.inputs:
            consumers.setdefault(name, []).append(record.name)
    for linear in (r for r in records if r.kind == "linear"):
        parts = max((_parts(s, linear) for s in _reach_splits(linear.name, consumers, by_name)), default=0)
        roles = linear.attrs.get("attention", {}).get("roles", [])
        parts = parts or (len(roles) if len(roles) > 1 else 0)
        if parts > 1:
            linear.attrs["fused_chunks"] = parts


def _reach_splits(start: str, consumers: dict[str, list[str]], by_name: dict[str, Measured]) -> Iterable[Measured]:
    queue, seen = deque(consumers.get(start, [])), set()
    while queue:
        name = queue.popleft()
        if name in seen or len(seen) > 64:
            continue
        seen.add(name)
        record = by_name[name]
        if is_split(record.op_name):
            yield record
        elif record.kind == "view" and record.op_name != "getitem":
            queue.extend(consumers.get(name, []))


def _parts(split: Measured, linear: Measured) -> int:
    """Parts of a split along the linear's feature dim (the split dim and all after it hold
    exactly out_features), or along a dim of exactly that many parts (qkv.unbind(0))."""
    shape, dim, parts = split.attrs.get("input_shape"), split.attrs.get("split_dim"), len(split.outputs)
    if shape is None or dim is None or parts < 2:
        return 0
    if math.prod(shape[dim:]) == linear.attrs["out_features"] or shape[dim] == parts:
        return parts
    return 0


# ---- head layout ---------------------------------------------------------------------------
def annotate_heads(records: list[Measured], by_name: dict[str, Measured]) -> None:
    """``attrs["head_split"]`` = the dims a view unflattens a linear's whole feature dim into
    ([heads, head_dim], Megatron's [heads, 3*head_dim], [3, heads, head_dim]), following the
    output through views that keep that dim last; absent when it is split or used whole."""
    consumers: dict[str, list[str]] = {}
    for record in records:
        for name in record.inputs:
            consumers.setdefault(name, []).append(record.name)
    for linear in (r for r in records if r.kind == "linear" and r.outputs and r.attrs.get("out_features")):
        dims = _head_split(linear, consumers, by_name)
        if dims:
            linear.attrs["head_split"] = dims


def _head_split(linear: Measured, consumers: dict[str, list[str]], by_name: dict[str, Measured]) -> list[int] | None:
    features, shape = linear.attrs["out_features"], list(linear.outputs[0].shape)
    rows = math.prod(shape[:-1])
    queue, seen = deque(consumers.get(linear.name, [])), set()
    while queue and len(seen) < 64:
        record = by_name[queue.popleft()]
        if record.name in seen or record.kind != "view" or not record.outputs or is_split(record.op_name):
            continue
        seen.add(record.name)
        out = list(record.outputs[0].shape)
        if out and out[-1] == features and math.prod(out[:-1]) == rows:
            queue.extend(consumers.get(record.name, []))  # a transpose/contiguous that keeps the features last
            continue
        for k in range(len(out) - 2, 0, -1):
            if math.prod(out[k:]) == features and math.prod(out[:k]) == rows:
                return out[k:]
    return None


# ---- experts ------------------------------------------------------------------------------
def annotate_experts(records: list[Measured], model: torch.nn.Module) -> None:
    graph: dict[str, list[str]] = {}  # node -> its consumers
    for record in records:
        for src in record.inputs:
            graph.setdefault(src, []).append(record.name)
    for name, container in model.named_modules():
        if not isinstance(container, (torch.nn.ModuleList, torch.nn.ModuleDict)) or len(container) < 2:
            continue
        members = _members(records, name, container)
        if sum(1 for m in members if m) >= 2 and _parallel(graph, members):
            for index, member in enumerate(members):
                for record in member:
                    if record.kind == "linear":
                        record.attrs["num_experts"], record.attrs["expert"] = len(container), index


def _members(records: list[Measured], name: str, container: torch.nn.Module) -> list[list[Measured]]:
    prefixes = [f"{name}.{child}" if name else child for child, _ in container.named_children()]
    members: list[list[Measured]] = [[] for _ in prefixes]
    index = {p: i for i, p in enumerate(prefixes)}
    for record in records:
        parts = record.module.split(".")
        depth = len(name.split(".")) + 1 if name else 1
        i = index.get(".".join(parts[:depth]))
        if i is not None:
            members[i].append(record)
    return members


def _parallel(graph: dict[str, list[str]], members: list[list[Measured]]) -> bool:
    owner = {r.name: i for i, member in enumerate(members) for r in member}
    for i, member in enumerate(members):
        reached = _descendants(graph, [r.name for r in member])
        if any(owner.get(n, i) != i for n in reached):
            return False
    return True


def _descendants(graph: dict[str, list[str]], sources: list[str]) -> set[str]:
    seen, queue = set(sources), deque(sources)
    while queue:
        name = queue.popleft()
        for nxt in graph.get(name, ()):
            if nxt not in seen:
                seen.add(nxt)
                queue.append(nxt)
    return seen
