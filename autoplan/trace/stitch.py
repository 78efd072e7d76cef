"""Export a few repeated blocks, not all of them: the graph of the rest is stitched from one
(docs/trace.md, "Exporting a few blocks": the timings and when it is refused).

When the model keeps its blocks in one ``nn.ModuleList`` (or ``nn.Sequential``) of ``N >=
MIN_BLOCKS`` modules that are alike from some block ``s`` on (same classes, parameter and buffer
layouts, no hooks, equal non-tensor attributes, ``layer_idx`` counting as equal), the model is
exported with only its first ``kept`` blocks (``KEPT = 3`` when ``s <= 1``, else ``s + 3``), and
the graph of blocks ``kept .. N-1`` is built by copying the last exported block's nodes, each copy
reading its own block's parameters and the previous copy's outputs: the graph a full export gives,
node for node. The stitch is refused, and the whole model exported, when the last two exported
blocks trace to different nodes, when a block reads any earlier block but the one before it (or a
node after the blocks any block but the last), or when the model does not run with fewer blocks.
"""

from __future__ import annotations

import types
from typing import Any

import torch
import torch.fx
import torch.nn as nn

from autoplan.types.graph import within

MIN_BLOCKS = 6  # below this a full export is cheap enough
KEPT = 3  # blocks 0, 1 and 2: block 0 may differ, 1 and 2 must trace alike


def repeated_blocks(model: nn.Module) -> tuple[str, nn.Module, int] | None:
    """(FQN, container, blocks to export) of the largest ModuleList/Sequential with a run of at
    least ``MIN_BLOCKS - 1`` alike blocks that reaches its end, or None (module docstring)."""
    best = None
    for name, module in model.named_modules():
        if type(module) not in (nn.ModuleList, nn.Sequential) or len(module) < MIN_BLOCKS:
            continue
        start = _run_start([_signature(block) for block in module])
        kept = KEPT if start <= 1 else start + KEPT
        if len(module) - start >= MIN_BLOCKS - 1 and kept < len(module):
            if best is None or len(module) > len(best[1]):
                best = (name, module, kept)
    return best


def _run_start(signatures: list[tuple]) -> int:
    """The first block of the longest run of alike blocks that ends with the last one."""
    start = len(signatures) - 1
    while start > 0 and _alike(signatures[start - 1], start - 1, signatures[start], start):
        start -= 1
    return start


def _signature(block: nn.Module) -> tuple:
    """What makes two blocks trace alike (module docstring); integers kept as they are, for
    :func:`_alike` to match positions."""
    parts = []
    for name, module in block.named_modules():
        if module._forward_hooks or module._forward_pre_hooks or module._backward_hooks:
            return ("hooked", id(module))
        params = tuple(
            (n, tuple(p.shape), p.dtype, p.requires_grad) for n, p in module._parameters.items() if p is not None
        )
        buffers = tuple((n, tuple(b.shape), b.dtype) for n, b in module._buffers.items() if b is not None)
        attrs = tuple(
            sorted(
                ((k, _value(v)) for k, v in vars(module).items() if not k.startswith("_") and k != "training"),
                key=lambda kv: kv[0],
            )
        )
        parts.append((name, type(module), params, buffers, attrs))
    return tuple(parts)


def _value(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, float, str, torch.dtype, torch.device)):
        return value
    if isinstance(value, (tuple, list)):
        return tuple(_value(v) for v in value)
    if isinstance(value, types.FunctionType):  # a per-instance forward (trace/moe.py routes experts so)
        return ("function", value.__code__)  # what it captures is checked where blocks must trace alike
    return ("object", id(value))  # shared objects (a config) are equal; distinct ones never are


def _alike(a: Any, position_a: int, b: Any, position_b: int) -> bool:
    """``a == b``, except that an integer equal to its block's position matches one equal to the
    other's (a ``layer_idx``)."""
    if isinstance(a, tuple) and isinstance(b, tuple):
        return len(a) == len(b) and all(_alike(x, position_a, y, position_b) for x, y in zip(a, b))
    if type(a) is int and type(b) is int and a == position_a and b == position_b:
        return True
    return type(a) is type(b) and a == b


def stitch(gm: torch.fx.GraphModule, *, prefix: str, blocks: list[nn.Module], kept: int = KEPT) -> bool:
    """Extend ``gm`` (exported with the first ``kept`` of ``blocks``) to all of them; False, with
    ``gm`` untouched, when its nodes break a rule of the module docstring."""
    runs = _block_runs(gm, prefix, kept)
    if runs is None or not _aligned(runs, prefix) or not _reads_only_previous(gm, runs, prefix):
        return False
    holder = gm.get_submodule(prefix)
    for index in range(kept, len(blocks)):
        holder.add_module(str(index), blocks[index])
    last, previous, anchor = runs[-1], runs[-1], runs[-1][-1]
    for index in range(kept, len(blocks)):
        previous, anchor = _copy_block(
            gm,
            last,
            previous_of=dict(zip(runs[-2], previous)),
            anchor=anchor,
            old=f"{prefix}.{kept - 1}",
            new=f"{prefix}.{index}",
        )
    final = dict(zip(last, previous))
    nodes = list(gm.graph.nodes)
    for node in nodes[nodes.index(anchor) + 1 :]:  # what follows the blocks reads the last copy
        node.args = torch.fx.node.map_arg(node.args, lambda n: final.get(n, n))
        node.kwargs = torch.fx.node.map_arg(node.kwargs, lambda n: final.get(n, n))
    gm.graph.lint()
    return True


def _copy_block(
    gm: torch.fx.GraphModule, last: list[torch.fx.Node], *, previous_of: dict, anchor: torch.fx.Node, old: str, new: str
) -> tuple[list[torch.fx.Node], torch.fx.Node]:
    """One copy of block ``last`` (FQN ``old``) as block ``new``, after ``anchor``: inputs from the
    block before it (``previous_of`` maps the exported previous block's nodes to that block's),
    parameters and buffers its own. Returns the copies and the new anchor."""
    made: dict[torch.fx.Node, torch.fx.Node] = {}
    copies = []
    for node in last:
        for arg in node.all_input_nodes:
            if arg.op == "get_attr" and within(str(arg.target), old) and arg not in made:
                with gm.graph.inserting_after(anchor):
                    made[arg] = anchor = gm.graph.get_attr(new + str(arg.target)[len(old) :])
        with gm.graph.inserting_after(anchor):
            copy = gm.graph.node_copy(node, lambda n: made.get(n) or previous_of.get(n, n))
        copy.meta = {**node.meta, "nn_module_stack": _renamed_stack(node.meta.get("nn_module_stack"), old, new)}
        made[node] = anchor = copy
        copies.append(copy)
    return copies, anchor


def _renamed_stack(stack: dict | None, old: str, new: str) -> dict | None:
    if not stack:
        return stack
    return {
        key.replace(old, new, 1): ((new + path[len(old) :]) if within(path, old) else path, kind)
        for key, (path, kind) in stack.items()
    }


def _block_of(node: torch.fx.Node, prefix: str) -> int | None:
    from autoplan.trace.propagate import module_path  # propagate imports capture, which imports this module

    path = str(node.target) if node.op == "get_attr" else module_path(node)
    if not within(path, prefix) or path == prefix:
        return None
    head = path[len(prefix) + 1 :].split(".", 1)[0]
    return int(head) if head.isdigit() else None


def _block_runs(gm: torch.fx.GraphModule, prefix: str, kept: int) -> list[list[torch.fx.Node]] | None:
    """The compute nodes of each exported block, in order; None unless each is one contiguous run."""
    runs: list[list[torch.fx.Node]] = [[] for _ in range(kept)]
    order: list[int] = []
    for node in gm.graph.nodes:
        block = None if node.op == "get_attr" else _block_of(node, prefix)
        if block is None:
            continue
        if order and order[-1] != block and block in order:
            return None
        if not order or order[-1] != block:
            order.append(block)
        runs[block].append(node)
    return runs if order == list(range(kept)) else None


def _aligned(runs: list[list[torch.fx.Node]], prefix: str) -> bool:
    """The last two exported blocks are the same ops on the same constants, wired the same way:
    an argument is the same position inside the block, the same position of the block before,
    the same parameter name inside the block, or the same node from outside every block."""
    before, a, b = runs[-3], runs[-2], runs[-1]
    if len(a) != len(b):
        return False
    shape_a, shape_b = _shaper(a, before, prefix), _shaper(b, a, prefix)
    return all(x.op == y.op and x.target == y.target and shape_a(x) == shape_b(y) for x, y in zip(a, b))


def _shaper(block: list[torch.fx.Node], previous: list[torch.fx.Node], prefix: str):
    inside, before = {n: i for i, n in enumerate(block)}, {n: i for i, n in enumerate(previous)}

    def one(node: torch.fx.Node) -> Any:
        if node in inside:
            return ("in", inside[node])
        if node in before:
            return ("previous", before[node])
        if node.op == "get_attr" and _block_of(node, prefix) is not None:
            return ("attr", str(node.target)[len(prefix) + 1 :].split(".", 1)[-1])
        return ("outside", node)

    def shape(node: torch.fx.Node) -> Any:
        return torch.fx.node.map_aggregate(
            (node.args, node.kwargs), lambda v: one(v) if isinstance(v, torch.fx.Node) else v
        )

    return shape


def _reads_only_previous(gm: torch.fx.GraphModule, runs: list[list[torch.fx.Node]], prefix: str) -> bool:
    """The last exported block reads no block but the one before it (nor another block's
    parameters), and nothing after the blocks reads any block but the last."""
    last = set(runs[-1])
    earlier = {n for run in runs[:-2] for n in run}
    for node in runs[-1]:
        for arg in node.all_input_nodes:
            if arg in earlier or (arg.op == "get_attr" and _block_of(arg, prefix) not in (None, len(runs) - 1)):
                return False
    inside = {n for run in runs for n in run}
    past_last = False
    for node in gm.graph.nodes:
        if node in last:
            past_last = True
        elif (
            past_last and node not in inside and any(arg in inside and arg not in last for arg in node.all_input_nodes)
        ):
            return False
    return True
