"""Which ops of a model the executor's tensor parallelism cannot run, seen while tracing.

Under ``tp > 1`` the executor makes every parameter a DTensor and lets activations flow as
DTensors (autoplan/execute/tensor_parallel.py), so *every* op that reads a parameter or an
activation derived from one, forward and backward, dispatches through DTensor's sharding
propagator, whether its module is split or replicated. An op the propagator has no strategy for
(``nn.LSTM``'s fused ``aten.mkldnn_rnn_layer``) makes the whole tensor-parallel run fail, so the
planner must not offer tp > 1 for that model (autoplan/solve/space.py: ``tp_blockers``).

The verdict is drawn from what the trace really dispatches, not from a list of module types:
:class:`OpRecorder` sees each aten op the node runs on fake tensors, keeps those DTensor would
see (an argument requires grad, or the op runs inside autograd's backward), and
:func:`lacking` asks the registry the executor dispatches through whether it can run them: a
registered strategy (op-level or single-dim), a custom handler, or a decomposition into ops that
have one (torch.distributed.tensor._sharding_prop: ``propagate_op_sharding_non_cached``), with
autoplan's own rules (autoplan/trace/dtensor_rules.py) registered first. Factory ops (no tensor
argument) and ops on plain tensors that need no gradient (masks, position buckets, token ids)
never meet a DTensor and are not judged. The trace runs CPU kernels; a CUDA kernel of the same op
(``_cudnn_rnn`` for ``mkldnn_rnn_layer``) has the same status in DTensor's tables.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

#: Ops DTensor's dispatcher answers itself, before any sharding propagation (torch.distributed.tensor._dispatch),
#: and torch.export's own checks (``_assert_tensor_metadata`` after a ``.to()``), which eager code never dispatches.
_NEVER_PROPAGATED = (
    "aten._local_scalar_dense.default",
    "aten.is_same_size.default",
    "aten.equal.default",
    "aten._assert_tensor_metadata.default",
    "aten._assert_scalar.default",
    "aten._assert_async.msg",
)


class OpRecorder(TorchDispatchMode):
    """Collects the aten ops a DTensor would dispatch (module docstring), in first-seen order."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: dict[Any, None] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        tensors = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        in_backward = torch._C._current_graph_task_id() != -1
        if tensors and (in_backward or any(t.requires_grad for t in tensors)):
            self.ops.setdefault(func, None)
        return func(*args, **kwargs)


def registry_modules() -> tuple[str, ...]:
    """The modules :func:`lacking` imports, for a caller that imports them up front (cli/trace.py)."""
    return ("torch.distributed.tensor", "autoplan.trace.dtensor_rules") if torch.distributed.is_available() else ()


def lacking(ops: list[Any]) -> list[str]:
    """The names of ``ops`` DTensor has no way to run (module docstring); [] when
    torch.distributed is not built in (then no tensor parallelism runs at all)."""
    if not torch.distributed.is_available():
        return []
    from torch.distributed.tensor import DTensor

    from autoplan.trace import dtensor_rules  # noqa: F401  (autoplan's rules, as the executor has them)

    dispatcher = DTensor._op_dispatcher
    prop = dispatcher.sharding_propagator
    known = (
        prop.op_strategy_funcs,
        getattr(prop, "op_single_dim_strategy_funcs", {}),
        getattr(prop, "op_to_rules", {}),
        dispatcher._custom_op_handlers,
    )
    return [str(op) for op in ops if not any(op in table for table in known) and not _runs_otherwise(op)]


def _runs_otherwise(op: Any) -> bool:
    """Answered by DTensor's dispatcher itself, or decomposed into ops with strategies."""
    if str(op) in _NEVER_PROPAGATED or not isinstance(op, torch._ops.OpOverload) or op.namespace != "aten":
        return True  # prim:: metadata ops (prim.device) read the DTensor's spec, never its shards
    from torch.distributed.tensor._decompositions import DecompShardingStrategy

    try:
        return bool(DecompShardingStrategy.has_decomp(op))
    except RuntimeError:  # an op without a dispatch table entry to ask
        return False
