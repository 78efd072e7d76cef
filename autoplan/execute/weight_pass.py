"""One re-run of each recomputed block in a split backward's W (docs/executor.md, "Zero-bubble and recomputation").

torch's W (``stage_backward_weight``, torch 2.13 ``torch/distributed/pipelining/_backward.py``) runs one
``autograd.grad`` per parameter group, and torch's non-reentrant checkpoint (``utils/checkpoint.py``,
``_checkpoint_hook.unpack_hook``) re-runs a block at each pass's first unpack, keyed by the graph task: a
LayerNorm-MLP block (three groups: the norm's, each linear's) re-ran three times in W, an examples/moe.py layer
seven, where one re-run ran in B (cost/stages.py prices one per block). Under a ``GraphExecGroup`` the checkpoint
keys its re-runs by the group instead, so W's passes share one re-run per block; torch asks that no two passes
unpack the same saved tensor, which holds: groups whose backwards share a node run as one
(split_backward.py ``join_sharing_groups``). The weight-only outputs' pass (``accumulate_weight_grads``) may
share nodes with a group, so it runs before, outside the group, with its own re-run where it reaches a block.

Memory stays one block's re-run, as before: a block's re-run is ended (its entries, its holders' handles: what
a finished pass leaves) after the last group whose backward runs one of the block's nodes
(:func:`tag_block_nodes` tags them at the forward; :func:`releases`), and every re-run left when W ends. A node
left untagged (made in a block but reaching no block output) only makes a later group re-run its block again.
"""

from __future__ import annotations

import weakref
from typing import Any, Iterable, Iterator

import torch
from torch.autograd.graph import Node
from torch.utils._pytree import tree_leaves

try:  # a torch without it: W's passes each re-run, as before (WeightPass is a plain context)
    from torch.utils.checkpoint import GraphExecGroup as _Group
except ImportError:  # pragma: no cover
    _Group = object

#: the key of an autograd node's metadata holding (weakly) the checkpoint frame whose forward made the node
FRAME_KEY = "autoplan.recompute.frame"


def tag_block_nodes(*, outputs: Any, inputs: Iterable[Any], frame: weakref.ref) -> None:
    """Tag each autograd node between a checkpointed block's ``inputs`` and ``outputs`` with its ``frame``
    (``node.metadata``, a weak reference: the node keeps the frame's hooks alive, not the reverse). The walk stops
    at the inputs' nodes and at nodes tagged already (an earlier block's); accumulators are left as they are."""
    stop = {t.grad_fn for t in inputs if isinstance(t, torch.Tensor) and t.grad_fn is not None}
    stack = [t.grad_fn for t in tree_leaves(outputs) if isinstance(t, torch.Tensor)]
    while stack:
        node = stack.pop()
        if node is None or node in stop or not node.next_functions or FRAME_KEY in node.metadata:
            continue
        node.metadata[FRAME_KEY] = frame
        stack += [parent for parent, _ in node.next_functions]


def releases(node_sets: list[set[Node]]) -> list[list[weakref.ref]]:
    """For each of W's groups (the nodes its backward runs), the checkpoint frames whose last group it is. A node
    may outlive the frame that tagged it: autocast's cached cast of a weight (``ToCopyBackward0``), made in one
    micro-batch's block and reused by the next's, tagged by the first, which has ended; it saves no tensor, so
    it is passed over (its dead reference cannot be hashed, either)."""
    last: dict[weakref.ref, int] = {}
    for index, nodes in enumerate(node_sets):
        for node in nodes:
            frame = node.metadata.get(FRAME_KEY)
            if frame is not None and frame() is not None:
                last[frame] = index
    after: list[list[weakref.ref]] = [[] for _ in node_sets]
    for frame, index in last.items():
        after[index].append(frame)
    return after


class WeightPass(_Group):
    """W's parameter groups as one graph-exec group (module docstring): ``over`` yields the groups to torch's W,
    ending after each group the re-runs ``after`` names for it; leaving ends every re-run still held."""

    def __init__(self, after: list[list[weakref.ref]] | None = None) -> None:
        self.after = after or []
        self.reran: list[weakref.ref] = []  # frames re-run under this group (recompute.py ``_checkpoint_split``)

    @staticmethod
    def current() -> Any:
        """The graph-exec group active on this thread (thread-local in torch), or None."""
        return _Group._get_current_group() if _Group is not object else None

    def __enter__(self) -> WeightPass:
        if _Group is not object:
            super().__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if _Group is not object:
            super().__exit__(*exc)
        for frame in self.reran:
            end_rerun(frame(), key=self)
        self.reran.clear()

    def over(self, groups: list[dict]) -> Iterator[dict]:
        for index, group in enumerate(groups):
            yield group  # torch's W runs this group's autograd.grad before asking for the next
            for frame in self.after[index] if index < len(self.after) else ():
                end_rerun(frame(), key=self)


def end_rerun(frame: Any, *, key: Any) -> None:
    """Leave ``frame`` (torch's ``_CheckpointFrame``) as a finished pass ``key`` leaves it, less its entries: the
    re-run's tensors dropped, its holders' handles and counters for ``key`` gone, so a later pass under the
    same key would re-run the block rather than miss a tensor."""
    if frame is None:
        return
    for ref in frame.weak_holders:
        holder = ref()
        if holder is not None:
            holder.handles.pop(key, None)
    for table in (frame.recomputed, frame.is_recomputed, frame.recomp_counter):
        table.pop(key, None)
