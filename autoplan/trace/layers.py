"""Blocks (the layers a pipeline splits between) and groups of identical blocks (the rules with
their reasons and examples: docs/trace.md, "Blocks and groups").

- **Blocks**: every ``nn.ModuleList`` / ``nn.Sequential`` (or ``nn.ModuleDict`` of one class) with two or more
  parameterised children is a candidate, scored by the parameters of its children whose class repeats; accepted in order
  of score (then child count), never nested, and only when each child runs as one contiguous
  stretch of the forward. Its parameterised children are the blocks.
- **Top-level modules**: without such a container, the parameterised children of the shallowest
  module with two or more (a single wrapper child looked through), when forward() calls each
  exactly once, in one uninterrupted call (needs the trace, ``records``).
- **Node layers**: a node belongs to the block whose FQN prefixes its module; a parameter-free
  node between blocks belongs to the block before it.
- **Groups**: blocks whose node sequences match (op kind, target, output shape, parameter shapes,
  sliding window: trace/windows.py) and backward FLOPs form one :class:`LayerGroup`; the signature
  is a hash of that sequence (``-bwdN`` added for the N-th backward of one sequence).
"""

from __future__ import annotations

import hashlib
from collections import Counter

import torch

from autoplan.trace.propagate import Measured, stack_path
from autoplan.types.graph import LayerGroup, within


def _numel(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def _holds_lists(children: list) -> bool:
    return any(isinstance(m, (torch.nn.ModuleList, torch.nn.ModuleDict)) for _, m, _ in children)


def find_blocks(model: torch.nn.Module, records: list[Measured] | None = None) -> list[str]:
    """Block FQNs, in module-registration order; with ``records``, only containers whose
    children each run once, contiguously (module docstring)."""
    candidates = []
    for name, container in model.named_modules():
        if not isinstance(container, (torch.nn.ModuleList, torch.nn.Sequential, torch.nn.ModuleDict)):
            continue
        children = [(f"{name}.{c}" if name else c, m, _numel(m)) for c, m in container.named_children()]
        children = [(c, m, n) for c, m, n in children if n > 0]
        if len(children) < 2:
            continue
        kinds = Counter(type(m).__name__ for _, m, _ in children)
        if isinstance(container, torch.nn.ModuleDict) and (len(kinds) > 1 or _holds_lists(children)):
            continue  # a dict of alike blocks: not nanoGPT's dict of wte, wpe, h and ln_f, nor a dict of block lists
        score = sum(n for _, m, n in children if kinds[type(m).__name__] >= 2)
        if score > 0:
            candidates.append((score, len(children), name, [c for c, _, _ in children]))
    accepted: list[tuple[str, list[str]]] = []
    for _, _, name, children in sorted(candidates, key=lambda c: (-c[0], -c[1])):
        if not any(_nested(name, other) for other, _ in accepted) and (
            records is None or _runs_once(records, children)
        ):
            accepted.append((name, children))
    blocks = [child for _, children in accepted for child in children]
    return blocks if blocks or records is None else top_level_blocks(model, records)


def top_level_blocks(model: torch.nn.Module, records: list[Measured]) -> list[str]:
    """The called children holding parameters of the shallowest module with two or more of them, if
    each is called once (module docstring, "Top-level modules"); else none."""
    prefix, module = "", model
    while True:
        children = [(f"{prefix}.{c}" if prefix else c, m) for c, m in module.named_children() if _numel(m) > 0]
        if len(children) != 1:
            break
        prefix, module = children[0]
    calls = _calls(records, [c for c, _ in children])
    live = _live_modules(records, {c for c, _ in children})
    # a child forward() never calls is no block, nor one whose output nothing uses (a pooler a masked LM drops):
    # its nodes are no stage's, and the pipeline split, which drops dead code, would lose the boundary
    called = [c for c, _ in children if calls.get(c) and c in live]
    return called if len(called) >= 2 and all(calls[c] == 1 for c in called) else []


def _live_modules(records: list[Measured], names: set[str]) -> set[str]:
    """The ``names`` with a record whose value reaches the model's output or loss."""
    by_name = {record.name: record for record in records}
    stack = [record.name for record in records if record.kind in ("output", "loss")]
    live: set[str] = set()
    while stack:
        name = stack.pop()
        if name in live or name not in by_name:
            continue
        live.add(name)
        stack.extend(by_name[name].inputs)
    return {child for record in records if record.name in live if (child := _innermost(record.module, names))}


def _calls(records: list[Measured], children: list[str]) -> Counter:
    """child -> how many calls of it the trace ran: runs of its records, broken by any other record
    (the parent's own ops between two calls) or by a new call of the same module (the
    ``nn_module_stack`` key torch.export and torch.fx give each call, ``part1@1`` for the second)."""
    names = set(children)
    runs: list[tuple[str | None, str | None]] = []
    for record in records:
        child = _innermost(record.module, names)
        run = (child, _call_key(record, child))
        if not runs or runs[-1] != run:
            runs.append(run)
    return Counter(child for child, _ in runs if child is not None)


def _call_key(record: Measured, child: str | None) -> str | None:
    """The ``nn_module_stack`` key of ``child``'s call that ``record`` ran in (None if unknown)."""
    if child is None or record.node is None:
        return None
    stack = record.node.meta.get("nn_module_stack") or {}
    keys = [key for key, (path, _) in stack.items() if stack_path(path) == child]
    return keys[0] if keys else None


def _runs_once(records: list[Measured], children: list[str]) -> bool:
    """Whether each child's nodes form a single contiguous run in execution order."""
    runs: list[str] = []
    names = set(children)
    for record in records:
        child = _innermost(record.module, names)  # siblings: at most one holds the module
        if child is not None and (not runs or runs[-1] != child):
            runs.append(child)
    return len(runs) == len(set(runs))


def _innermost(path: str, names: set[str]) -> str | None:
    """The longest of ``names`` that ``path`` is within (:func:`within`), or None: the path's
    own prefixes, longest first, looked up (a dotted path has few; the names may be many)."""
    while path:
        if path in names:
            return path
        path = path.rpartition(".")[0]
    return None


def _nested(a: str, b: str) -> bool:
    return not a or not b or within(a, b) or within(b, a)


def assign_layers(records: list[Measured], blocks: list[str]) -> dict[str, str | None]:
    """node name -> block FQN (or None), and the blocks in execution order."""
    names = set(blocks)
    layer_of: dict[str, str | None] = {}
    for record in records:
        layer_of[record.name] = _innermost(record.module, names)  # the innermost block holding it
    positions = [i for i, r in enumerate(records) if layer_of[r.name] is not None]
    if positions:
        current = None
        for record in records[positions[0] : positions[-1] + 1]:
            if layer_of[record.name] is not None:
                current = layer_of[record.name]
            elif not record.params and record.kind not in ("input", "output", "loss"):
                layer_of[record.name] = current
    return layer_of


def execution_order(records: list[Measured], layer_of: dict[str, str | None]) -> list[str]:
    order: list[str] = []
    for record in records:
        layer = layer_of[record.name]
        if layer is not None and layer not in order:
            order.append(layer)
    return order


def group_layers(
    records: list[Measured], layer_of: dict[str, str | None], layers: list[str], param_shapes: dict[str, list[int]]
) -> list[LayerGroup]:
    members: dict[str | None, list[Measured]] = {layer: [] for layer in layers}
    for record in records:
        members.setdefault(layer_of[record.name], []).append(record)
    signatures: dict[tuple[str, tuple[int, ...]], list[str]] = {}
    for layer in layers:
        # blocks alike but for their backward (the first ones behind frozen parameters compute no
        # input gradient: docs/cost-model.md, "Frozen parameters") are priced apart
        backward = tuple(record.bwd_flops for record in members[layer])
        signatures.setdefault((_signature(members[layer], layer, param_shapes), backward), []).append(layer)
    named: dict[str, int] = {}
    groups = []
    for (sig, _), names in signatures.items():
        named[sig] = named.get(sig, -1) + 1
        groups.append(LayerGroup(signature=f"{sig}-bwd{named[sig]}" if named[sig] else sig, layers=names))
    return groups


def _signature(members: list[Measured], layer: str, param_shapes: dict[str, list[int]]) -> str:
    digest = hashlib.sha1()
    for record in members:
        shape = list(record.outputs[0].shape) if record.outputs else []
        params = sorted(tuple(param_shapes.get(p, [])) for p in record.params)
        key = (record.kind, record.target, record.op_name, shape, params, record.module.removeprefix(layer))
        window = record.attrs.get("window")  # a sliding-window layer is priced apart from a full one
        digest.update(repr(key + (window,) if window else key).encode())
    return f"{len(members)}ops-{digest.hexdigest()[:12]}"
