"""Activation recomputation per block, as ``plan.recompute`` says.

- ``full``: checkpoint each block: keep only its inputs, rerun its forward in backward.
- ``selective``: op-level selective activation checkpointing (torch.utils.checkpoint with a policy, as
  torchtitan's op SAC): the outputs of matmuls (grouped and FP8-scaled ones too), attention kernels and
  convolutions are saved, everything else (norms, activations, softmax, element-wise ops, FP8's scaling passes) is
  recomputed, and the functional all-to-all's output is kept, so the expert dispatch never sends again (as
  torchtitan's op SAC). The kernels saved are the cost model's own table (autoplan/types/saved_ops.py
  ``SAVED_ATEN_OPS``), so what is priced as kept is kept: re-run the forward of the other nodes, keep the block
  inputs and the saved outputs. It frees Korthikanti et al.'s softmax and dropout s^2 tensors but keeps the QK^T
  scores, a matmul output.
- The whole block is re-run: torch stops a recomputation early once the last tensor the backward needs is rebuilt
  (skipping a block's output projection and its TP all-reduce), but the cost model prices the whole forward and
  its collectives, so early stop is turned off.
- Under a split backward (types/schedules.py ``SPLIT_BACKWARD``) torch re-runs a block in B's pass and again in
  W's; SAC gives each kept output to one re-run, so it stays for the next, as an alias (:class:`_KeptForEachRerun`).
  A re-run's tensors its pass never unpacks are dropped when it ends (:func:`_checkpoint_split`); W's passes (one
  per parameter group) share one re-run per block (execute/weight_pass.py), ended after its last reader.
- Under selective recomputation a block's modules write anew, not in place (:func:`out_of_place`).
- A budget (``plan.recompute_blocks``, autoplan/types/recompute.py) checkpoints only the first k blocks of each
  pipeline chunk (``plan.stages``; else every block), the rest run as under "none": :func:`recompute_targets`.
- A plan recomputing on a rank that holds none of its target blocks is refused (execute/api.py), not skipped.

The block's ``forward`` is replaced on the instance: FQNs (tp_plan keys, FSDP, --verify's names) stay unchanged.
"""

from __future__ import annotations

import functools
import inspect
import sys
import threading
import weakref

import torch
import torch.nn as nn
from torch.utils._pytree import tree_leaves, tree_map_only
from torch.utils.checkpoint import (
    _RECOMPUTE,
    CheckpointPolicy,
    _CachedTorchDispatchMode,
    _checkpoint_without_reentrant_generator,
    _sac_storage_key,
    checkpoint,
    create_selective_checkpoint_contexts,
    noop_context_fn,
    set_checkpoint_early_stop,
)

from autoplan.execute.rerun_buffers import BuffersAsFound
from autoplan.execute.weight_pass import WeightPass, tag_block_nodes
from autoplan.types.plan import Plan
from autoplan.types.recompute import recomputed_blocks
from autoplan.types.saved_ops import SAVED_ATEN_OPS

#: the kernels whose outputs selective recomputation keeps: the cost model's table (types/saved_ops.py)
SAVED_OPS = SAVED_ATEN_OPS


def _policy(ctx, op, *args, **kwargs) -> CheckpointPolicy:
    if _IN_RNN.depth:  # nothing kept inside a recurrent layer's kernels (:func:`_rnn_recomputed`)
        return CheckpointPolicy.PREFER_RECOMPUTE
    packet = getattr(op, "_overloadpacket", None)
    saved = packet is not None and packet.__name__ in SAVED_OPS
    return CheckpointPolicy.MUST_SAVE if saved else CheckpointPolicy.PREFER_RECOMPUTE


class _Depth(threading.local):
    depth = 0


_IN_RNN = _Depth()


def _rnn_recomputed(block: nn.Module) -> None:
    """Selective recomputation keeps nothing inside ``block``'s recurrent layers (nn.RNN, GRU, LSTM): their CPU
    kernels update the matmul outputs SAC kept in place (a cell's gates), so the re-run took altered values and the
    GRU's gradients came out 25-36% off (found by a helper; full recomputation was right). Inside them every op is
    re-run."""
    for layer in (m for m in block.modules() if isinstance(m, nn.RNNBase)):
        layer.forward = _counted(layer.forward)


def _counted(forward):
    @functools.wraps(forward)
    def run(*args, **kwargs):
        _IN_RNN.depth += 1
        try:
            return forward(*args, **kwargs)
        finally:
            _IN_RNN.depth -= 1

    return run


class _KeptForEachRerun(_CachedTorchDispatchMode):
    """SAC's re-run mode (torch.utils.checkpoint, 2.13), each kept output left in the cache for the block's next
    re-run: B's and W's under a split backward (module docstring). Each re-run gets an alias of the kept output
    (``detach``), not the cached tensor: autograd records the re-run's node on the tensor an op returns, and on the
    cached one, kept for the next re-run, that node held the re-run's whole graph (every tensor it saved: a GELU's
    output, a linear's input) until the step's end, so by a chunk's last block its B held every block's re-run,
    where the price holds one (docs/executor.md, "Selective recomputation against its price")."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        key = _sac_storage_key(func, args)
        index, entries = self.func_counter[key], self.storage.get(key)
        kept = entries.get(index) if entries is not None else None
        out = super().__torch_dispatch__(func, types, args, kwargs)
        if kept is not None and kept is not _RECOMPUTE and self.func_counter[key] == index + 1:  # given, not ignored
            entries[index] = kept
            out = tree_map_only(torch.Tensor, torch.Tensor.detach, out)
        return out


def _split_backward_contexts():
    """SAC's forward and re-run modes, the re-run keeping each output for the next (:class:`_KeptForEachRerun`)."""
    caching, cached = create_selective_checkpoint_contexts(_policy)
    return caching, _KeptForEachRerun(None, cached.storage, cached.allow_cache_entry_mutation)


#: torch's generator takes the arguments _checkpoint_split passes (2.13's); else plain checkpoint runs
_SPLIT_RUNS = "early_stop" in inspect.signature(_checkpoint_without_reentrant_generator).parameters


def _checkpoint_split(function, context_fn, *args, **kwargs):
    """``checkpoint(use_reentrant=False)``'s body (torch.utils.checkpoint, 2.13), each re-run's tensors dropped when
    its backward pass ends. torch's unpack hook re-runs the block once per pass (graph task id) and keeps what it
    saves in ``frame.recomputed[task]``, each entry freed when unpacked; under a split backward the tensors only
    W's nodes unpack stay after B's pass, those only B's unpack after W's, until the graph is freed. No pass
    reads another's entries (the key is its task id), so dropping a pass's entries at its end is sound. The frame is
    held weakly: a strong reference would close a cycle (frame, its re-run, this closure) that only gc frees.
    Under W's group (execute/weight_pass.py) the re-run is keyed by the group, which ends it; the block's autograd
    nodes are tagged with the frame, for the group to know each block's last parameter group."""
    frame = {}

    def rerun(*a, **kw):
        task = torch._C._current_graph_task_id()
        if isinstance(WeightPass.current(), WeightPass):  # W's groups share one re-run (execute/weight_pass.py)
            WeightPass.current().reran.append(frame["frame"])
        elif task != -1:  # a re-run inside a backward pass: forget its tensors once the pass ends
            drop = functools.partial(frame["frame"]().recomputed.pop, task, None)
            torch.autograd.Variable._execution_engine.queue_callback(drop)
        return function(*a, **kw)

    gen = _checkpoint_without_reentrant_generator(rerun, True, context_fn, "default", False, False, *args, **kwargs)
    next(gen)
    if "new_frame" not in gen.gi_frame.f_locals:  # another torch's internals: its own checkpoint, leftovers kept
        gen.close()
        return checkpoint(function, *args, use_reentrant=False, context_fn=context_fn, **kwargs)
    frame["frame"] = weakref.ref(gen.gi_frame.f_locals["new_frame"])
    try:
        out = rerun(*args, **kwargs)
    except BaseException:
        gen.close()
        raise
    next(gen, None)
    tag_block_nodes(outputs=out, inputs=tree_leaves((args, kwargs)), frame=frame["frame"])
    return out


def _checkpointed(block: nn.Module, forward, selective: bool, split_backward: bool):
    context_fn = None
    if selective:
        context_fn = _split_backward_contexts if split_backward else functools.partial(
            create_selective_checkpoint_contexts, _policy
        )  # fmt: skip

    @functools.wraps(forward)
    def run(*args, **kwargs):
        found = BuffersAsFound(block)  # each re-run on the buffers this call found (execute/rerun_buffers.py)
        out = _run(found.wrap(forward), *args, **kwargs)
        found.forward_done()
        return out

    def _run(function, *args, **kwargs):
        with set_checkpoint_early_stop(False):  # re-run the whole block, as priced (module docstring)
            if split_backward and _SPLIT_RUNS:
                return _checkpoint_split(function, context_fn or noop_context_fn, *args, **kwargs)
            if context_fn is None:
                return checkpoint(function, *args, use_reentrant=False, **kwargs)
            return checkpoint(function, *args, use_reentrant=False, context_fn=context_fn, **kwargs)

    return run


def apply_recompute(*, module: nn.Module, blocks: list[str], mode: str, split_backward: bool = False) -> int:
    """Checkpoint every block of ``blocks`` present in ``module``; return how many. ``split_backward``: the
    schedule runs B and W apart (module docstring)."""
    if mode == "none":
        return 0
    present = dict(module.named_modules())
    count = 0
    for fqn in blocks:
        if fqn in present:
            block = _compiled_inside(present[fqn])
            if mode == "selective":
                _rnn_recomputed(block)
            block.forward = _checkpointed(
                block, block.forward, selective=mode == "selective", split_backward=split_backward
            )
            count += 1
    return count


def _compiled_inside(block: nn.Module) -> nn.Module:
    """The module a ``torch.compile``-d block compiles (its ``_orig_mod``), else the block: checkpointed inside, the
    compiled graph holds the checkpoint (torch.compile traces it), where a selective checkpoint around the compiled
    module stopped its backward ("Tensor cached during selective activation checkpoint has been mutated") or its
    compilation."""
    frame = sys.modules.get("torch._dynamo.eval_frame")  # no compiled module without it: never imported here
    return block._orig_mod if frame is not None and isinstance(block, frame.OptimizedModule) else block


def out_of_place(*, module: nn.Module, blocks: list[str]) -> int:
    """Turn off the ``inplace`` flag of every module inside ``blocks`` (nn.ReLU(inplace=True), nn.Dropout(inplace=
    True), ...); return how many. Selective recomputation keeps a matmul's output by reference, and an activation
    written over it in place (HF Swinv2's Linear -> ReLU(inplace=True)) stopped the backward ("Tensor cached during
    selective activation checkpoint has been mutated"); the out-of-place op computes the same values."""
    present, count = dict(module.named_modules()), 0
    for fqn in blocks:
        for sub in present[fqn].modules() if fqn in present else ():
            if getattr(sub, "inplace", None) is True:
                sub.inplace, count = False, count + 1
    return count


def recompute_targets(*, plan: Plan, blocks: list[str]) -> list[str]:
    """The blocks ``plan`` recomputes: every block, or the first ``plan.recompute_blocks[c]`` of each
    chunk ``c`` of ``plan.stages`` (``blocks``, in order, being the one chunk of a plan without stages)."""
    chunks = plan.stages or [blocks]
    return recomputed_blocks(recompute=plan.recompute, recompute_blocks=plan.recompute_blocks, chunks=chunks)


def expects_recompute(*, plan: Plan, targets: list[str], chunks: list[int]) -> bool:
    """Whether this rank, running pipeline ``chunks``, must checkpoint some block: under every-block
    recompute always; under a budget when a target lies in its chunks (a chunk budgeted 0 has none)."""
    if plan.recompute == "none" or not plan.recompute_blocks:
        return plan.recompute != "none"
    held = {block for c in chunks for block in plan.stages[c]} if plan.stages else set(targets)
    return any(block in held for block in targets)
