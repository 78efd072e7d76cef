"""The weight gradients torch's split backward leaves out: those of stage outputs no stage input reaches
(docs/executor.md, "Zero-bubble: the weight-only outputs").

Zero-bubble schedules split a stage's backward in two (torch 2.13, ``torch/distributed/pipelining/_backward.py``):
B (``stage_backward_input``) computes the inputs' gradients and saves the gradient reaching each
"intermediate", the first node on a parameter's way to the outputs that a stage input reaches too; W
(``stage_backward_weight``) runs backward from those intermediates only. A stage output that depends on
parameters alone (T5's position bias, made in a decoder block and sent to the next stage beside the hidden
states; a decoder's token embedding looked up at the end of the encoder's stage) reaches the parameters
through no intermediate, so its gradient is never computed: T5's relative-attention bias and tied embedding
gradients were 45-65% off under ``--verify``. The first stage is spared (torch runs its W as a full backward).

With o_1..o_k those outputs and g_i their received gradients, W adds

    dL/dw  +=  sum_i  g_i^T  d o_i / d w          (one ``autograd.grad`` from the o_i to the stage's weights)

before torch's own W, keeping the graph for it (the o_i's subgraph can share nodes with an intermediate's,
position bias used in the stage and sent on). Gradients are linear in the output gradients, so the two sums
are the full backward's; no o_i is below an intermediate (no input reaches it), so nothing is counted twice.
Torch's W also runs one backward per parameter group without keeping the graph, which frees nodes another
group's backward needs (T5's last stage at v = 1): such groups go to W as one (:func:`join_sharing_groups`).
"""

from __future__ import annotations

import collections
from typing import Any, Iterable

import torch
from torch.autograd.graph import GradientEdge, Node, get_gradient_edge

#: (the edge of a weight-only stage output, the gradient it received)
Root = tuple[GradientEdge, torch.Tensor]


def weight_only_roots(*, outputs: Any, output_grads: Any, inputs: Iterable[Any]) -> list[Root]:
    """The stage outputs (with their gradients) that no stage input requiring grad reaches; ``output_grads``
    None means ``outputs`` is the loss (gradient one), as torch's ``stage_backward_input`` takes it."""
    flat = [outputs] if isinstance(outputs, torch.Tensor) else list(outputs)
    grads = [None] * len(flat) if output_grads is None else list(output_grads)
    pairs = [
        (o, torch.ones_like(o) if output_grads is None else g)
        for o, g in zip(flat, grads, strict=True)
        if isinstance(o, torch.Tensor) and o.requires_grad and (g is not None or output_grads is None)
    ]
    sources = [get_gradient_edge(t).node for t in inputs if isinstance(t, torch.Tensor) and t.requires_grad]
    edges = [get_gradient_edge(o) for o, _ in pairs]
    reached = _downstream(sources, consumers=_consumers(e.node for e in edges))
    return [(edge, g) for edge, (_, g) in zip(edges, pairs) if edge.node not in reached]


def accumulate_weight_grads(*, roots: list[Root], weights: Iterable[torch.nn.Parameter]) -> None:
    """Add the ``roots``' part of each weight's gradient into ``weight.grad`` (module docstring), keeping
    the graph for torch's W that follows."""
    weights = [w for w in weights if w.requires_grad]
    if not roots or not weights:
        return
    grads = torch.autograd.grad(
        [edge for edge, _ in roots],
        [get_gradient_edge(w) for w in weights],
        grad_outputs=[g for _, g in roots],
        retain_graph=True,
        allow_unused=True,
    )
    for weight, grad in zip(weights, grads, strict=True):
        if grad is None:
            continue
        if weight.grad is None:
            weight.grad = grad
        else:
            weight.grad += grad


def join_sharing_groups(groups: list[dict]) -> list[dict]:
    """Torch's parameter groups of one B, those whose W backwards share autograd nodes joined into one, so that
    W runs one ``autograd.grad`` over their intermediates. Torch runs one per group without keeping the graph,
    and where two groups' backwards share nodes (T5's last stage at v = 1) the second finds them freed; in one
    call each intermediate's gradient is still pinned to the one B saved (torch's own rule within a group), so
    nothing is counted twice. Groups that share nothing stay apart: a joined call also runs the input-gradient
    work between its intermediates (discarded by the pins), which the price does not hold."""
    return joined_groups(groups)[0]


def joined_groups(groups: list[dict]) -> tuple[list[dict], list[set[Node]]]:
    """:func:`join_sharing_groups`'s groups, and the autograd nodes each one's W backward runs (none listed for
    a single group: nothing to join, and W's one pass ends every re-run, execute/weight_pass.py)."""
    if len(groups) <= 1:
        return groups, [set() for _ in groups]
    nodes = [_w_nodes(g) for g in groups]
    owner = list(range(len(groups)))

    def find(i: int) -> int:
        while owner[i] != i:
            i = owner[i]
        return i

    seen: dict = {}
    for index, found in enumerate(nodes):
        for node in found:
            if node in seen:
                owner[find(index)] = find(seen[node])
            seen.setdefault(node, index)
    joined: dict[int, list[dict]] = collections.defaultdict(list)
    joined_nodes: dict[int, set[Node]] = collections.defaultdict(set)
    for index, group in enumerate(groups):
        joined[find(index)].append(group)
        joined_nodes[find(index)] |= nodes[index]
    merged = [members[0] if len(members) == 1 else _one_group(members) for members in joined.values()]
    return merged, [joined_nodes[root] for root in joined]


def _one_group(groups: list[dict]) -> dict:
    return {
        "params": set().union(*(g["params"] for g in groups)),
        "intermediates": [node for g in groups for node in g["intermediates"]],
        "grads": [grad for g in groups for grad in g.get("grads", [None] * len(g["intermediates"]))],
    }


def _w_nodes(group: dict) -> set[Node]:
    """The autograd nodes a group's W backward runs: those on a path from its intermediates to its
    parameters' gradient accumulators (the engine runs no other)."""
    targets, reaches = set(group["params"]), {}
    for start in group["intermediates"]:
        stack = [(start, False)]
        while stack:
            node, done = stack.pop()
            if node is None or (node in reaches and not done):
                continue
            if done:
                kids = [p for p, _ in node.next_functions if p is not None]
                reaches[node] = node in targets or any(reaches.get(k, False) for k in kids)
                continue
            reaches[node] = False  # in progress
            stack.append((node, True))
            stack += [(p, False) for p, _ in node.next_functions if p is not None and p not in reaches]
    return {node for node, hit in reaches.items() if hit and node not in targets}


def _consumers(roots: Iterable[Node]) -> dict[Node, list[Node]]:
    """Each autograd node below ``roots`` and the nodes that consume its output (the forward's direction)."""
    consumers: dict[Node, list[Node]] = collections.defaultdict(list)
    seen = set()
    queue = collections.deque(n for n in roots if n is not None)
    while queue:
        node = queue.popleft()
        if node in seen:
            continue
        seen.add(node)
        for parent, _ in node.next_functions:
            if parent is not None:
                consumers[parent].append(node)
                queue.append(parent)
    return consumers


def _downstream(sources: list[Node], *, consumers: dict[Node, list[Node]]) -> set[Node]:
    """The nodes a value flows into from ``sources``, the sources included."""
    reached = set(sources)
    queue = collections.deque(sources)
    while queue:
        for node in consumers.get(queue.popleft(), ()):
            if node not in reached:
                reached.add(node)
                queue.append(node)
    return reached
