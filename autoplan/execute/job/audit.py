"""The execution audit: measure, on a real step, what the cost model prices (docs/cost-model.md,
"The execution audit"). One training step runs under three recorders, each a
``TorchDispatchMode`` (run as one, meters.py ``StepRecorders``), so they see every op that reaches the
dispatcher, from Python and C++ alike:

- :class:`CommRecorder`: every ``c10d`` and ``_c10d_functional`` collective, its kind, its message
  bytes (autoplan/cost/network/comm.py's convention) and its process group's mesh dimension: by its
  ranks, except context parallelism's KV exchange, "cp" by its own group (whose ranks a dp x cp
  gradient sync may share at dp = 1), and that sync, "dp" over the dp x cp ranks;
- :class:`~autoplan.execute.job.meters.LiveBytes`: the peak of live tensor bytes on this rank and
  the op running at the peak;
- :class:`~autoplan.execute.job.meters.MatmulFlops`: FLOPs of matmul-class ops and, apart, of
  attention kernels, forward and backward.

Beside them it reads DTensor's in-place reshards (autoplan/execute/dtensor_handlers.py
``RESHARDED``), priced at 0. Each recorder returns ``NotImplemented`` for a DTensor op (as torch's
``CommDebugMode`` does), so DTensor's own collectives reach it on local tensors; collectives from
gloo's callback threads are caught by wrapping ``torch.distributed.all_reduce``.
"""

from __future__ import annotations

import gc
import math
import threading
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from autoplan.execute.activation_offload import link_copies
from autoplan.execute.compiled import compiled_kernels
from autoplan.execute.dtensor_handlers import RESHARDED
from autoplan.execute.job.held import existing_tensors, placement
from autoplan.execute.job.meters import LiveBytes, MatmulFlops, StepRecorders, on_dtensors
from autoplan.execute.job.routing_audit import PEAK, at_routing, counted_rows, edp_by_name, routing_rows
from autoplan.execute.job.sparse_audit import TOUCHED_ROWS, c10d_records
from autoplan.execute.mesh import grad_groups

MESH_DIMS, UNITS = ("dp", "tp", "pp"), {TOUCHED_ROWS: "rows"}  # a comm row's unit: bytes, but a sparse table's rows
EXPERT_DIMS = ("ep", "edp", "etp")  # the expert mesh's axes (autoplan/execute/mesh.py, expert_mesh)
ALL_TO_ALL_DIMS = ("ep", "etp")  # their all-to-alls are theirs though tp or dp may hold the same ranks
#: c10d op name -> (collective kind, which argument holds the message, which holds the group)
C10D_OPS = {
    "allreduce_": ("all_reduce", 0, 1),
    "allreduce_coalesced_": ("all_reduce", 0, 1),
    "_allgather_base_": ("all_gather", 0, 2),
    "allgather_": ("all_gather", 0, 2),
    "allgather_into_tensor_coalesced_": ("all_gather", 0, 2),
    "_reduce_scatter_base_": ("reduce_scatter", 1, 2),
    "reduce_scatter_": ("reduce_scatter", 1, 2),
    "reduce_scatter_tensor_coalesced_": ("reduce_scatter", 1, 2),
    "broadcast_": ("broadcast", 0, 1),
    "send": ("send", 0, 1),
    "recv_": ("recv", 0, 1),
    "alltoall_base_": ("all_to_all", 1, 2),
    "alltoall_": ("all_to_all", 1, 2),
    "scatter_": ("scatter", 0, 2),
    "gather_": ("gather", 1, 2),
}
#: _c10d_functional op name -> (kind, index of the group name argument, gathered-size argument or None)
FUNCTIONAL_OPS = {
    "all_reduce": ("all_reduce", 2, None),
    "all_reduce_": ("all_reduce", 2, None),
    "all_reduce_coalesced": ("all_reduce", 2, None),
    "all_gather_into_tensor": ("all_gather", 2, 1),
    "all_gather_into_tensor_out": ("all_gather", 2, 1),
    "all_gather_into_tensor_coalesced": ("all_gather", 2, 1),
    "reduce_scatter_tensor": ("reduce_scatter", 3, None),
    "reduce_scatter_tensor_coalesced": ("reduce_scatter", 3, None),
    "all_to_all_single": ("all_to_all", 3, None),
    "broadcast": ("broadcast", 2, None),
}


def _tensor_bytes(obj: Any) -> int:
    return sum(t.numel() * t.element_size() for t in tree_flatten(obj)[0] if isinstance(t, torch.Tensor))


def group_dims(
    mesh: Any, extra: dict[str, str] | None = None, experts: Any = None, grad_mesh: Any = None
) -> dict[frozenset, str]:
    """{ranks of a process group: mesh dim} for this rank's groups of the plan's mesh, plus
    ``extra`` groups by name (tied weights) and, under expert parallelism (``experts``, an
    ExpertParallel), the edp and ep groups where they are not already a dp group. Groups are told
    apart by their ranks, since DTensor and a sub-mesh may each hold their own process group over
    the same ranks. ``grad_mesh``: the dp x cp ranks that sync gradients, counted as dp."""
    dims: dict[frozenset, str] = {}
    for sub, dim in grad_groups(grad_mesh):
        dims[_ranks(sub.get_group())] = dim
    for dim in MESH_DIMS:
        if dim in (mesh.mesh_dim_names or ()) and mesh[dim].size() > 1:
            dims.setdefault(frozenset(dist.get_process_group_ranks(mesh[dim].get_group())), dim)
    for name, dim in (extra or {}).items():
        dims.setdefault(_ranks(name), dim)
    for dim, sub in _expert_meshes(experts):
        dims.setdefault(_ranks(sub.get_group()), dim)
    return dims


def all_to_all_dims(experts: Any) -> dict[frozenset, str]:
    """{ranks: dim} of the ep and etp groups, whose all-to-alls are theirs though dp or tp hold their ranks."""
    return {_ranks(sub.get_group()): dim for dim, sub in _expert_meshes(experts) if dim in ALL_TO_ALL_DIMS}


def _expert_meshes(experts: Any) -> list[tuple[str, Any]]:
    if experts is None:
        return []
    meshes = {"ep": experts.ep_mesh, "edp": experts.edp_mesh, "etp": experts.etp_mesh}
    # a one-rank edp group (ep = dp) still carries ZeRO-1's sharded step of the experts
    return [(dim, sub) for dim in EXPERT_DIMS if (sub := meshes[dim]) is not None and (sub.size() > 1 or dim == "edp")]


def _ranks(group: Any) -> frozenset:
    """The global ranks of a process group, given as a group or by its name."""
    if isinstance(group, str):
        group = dist.distributed_c10d._resolve_process_group(group)
    return frozenset(dist.get_process_group_ranks(group))


@dataclass
class CommTotals:
    """Collectives of one rank: (dim, kind) -> [count, bytes]."""

    by_key: dict[tuple[str, str], list[int]] = field(default_factory=lambda: defaultdict(lambda: [0, 0]))

    def add(self, dim: str, kind: str, message_bytes: int, count: int = 1) -> None:
        entry = self.by_key[(dim, kind)]
        entry[0] += count
        entry[1] += int(message_bytes)

    def rows(self) -> list[tuple[str, str, int, int]]:
        return sorted((dim, kind, c, b) for (dim, kind), (c, b) in self.by_key.items() if c)


class CommRecorder(TorchDispatchMode):
    """Records each collective this rank issues (module docstring)."""

    def __init__(
        self,
        groups: dict[frozenset, str],
        all_to_all: dict[frozenset, str] | None = None,
        named: dict[str, str] | None = None,
    ):
        super().__init__()
        self.groups = groups
        self.all_to_all = all_to_all or {}  # groups whose all-to-alls belong to another dim (ep)
        self.totals = CommTotals()
        # groups whose dim is theirs by name, whatever their ranks (cp's KV exchange)
        self._known: dict[Any, str] = {(name, a2a): dim for name, dim in (named or {}).items() for a2a in (False, True)}

    def __enter__(self):
        self.patch()
        return super().__enter__()

    def __exit__(self, *exc):
        self.unpatch()
        return super().__exit__(*exc)

    def patch(self) -> None:
        """Count ``torch.distributed.all_reduce`` calls from gloo's callback threads (module docstring)."""
        self._thread, self._all_reduce = threading.get_ident(), dist.all_reduce
        recorder = self

        def all_reduce(tensor, *args, **kwargs):  # torch.distributed.all_reduce's signature
            if threading.get_ident() != recorder._thread:  # the mode sees this thread's own calls
                group = kwargs.get("group", args[1] if len(args) > 1 else None) or dist.group.WORLD
                recorder.totals.add(recorder._dim(group, "all_reduce"), "all_reduce", _tensor_bytes(tensor))
            return recorder._all_reduce(tensor, *args, **kwargs)

        dist.all_reduce = all_reduce

    def unpatch(self) -> None:
        dist.all_reduce = self._all_reduce

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if on_dtensors(types):
            return NotImplemented
        self.record(func, args)
        return func(*args, **(kwargs or {}))

    def record(self, func, args: tuple) -> None:
        """Record ``func`` if it is a collective, before it runs."""
        namespace, name = _collective(func)
        if namespace == "c10d":
            self._record_c10d(name, args)
        elif namespace == "_c10d_functional":
            self._record_functional(name, args)

    @staticmethod
    def runs_ops(func) -> bool:
        """Whether :meth:`record` may run ops itself: a c10d all-reduce of sparse tensors coalesces them."""
        return _collective(func)[0] == "c10d"

    def _dim(self, group: Any, kind: str) -> str:
        """The mesh dim of a process group (or group name): by its ranks; "world" or "other" else."""
        key = (group if isinstance(group, str) else group.group_name, kind == "all_to_all")
        if key not in self._known:
            ranks = _ranks(group)
            world = len(ranks) == dist.get_world_size()
            found = self.all_to_all.get(ranks) if kind == "all_to_all" else None
            self._known[key] = found or self.groups.get(ranks, "world" if world else "other")
        return self._known[key]

    def _record_c10d(self, name: str, args: tuple) -> None:
        kind, message, group = C10D_OPS[name]
        pg = dist.ProcessGroup.unbox(args[group]) if isinstance(args[group], torch.ScriptObject) else args[group]
        for what, size, count in c10d_records(kind, args[message], pg.size(), _tensor_bytes):  # sparse_audit.py
            self.totals.add(self._dim(pg, kind), what, size, count)

    def _record_functional(self, name: str, args: tuple) -> None:
        kind, group, gathered = FUNCTIONAL_OPS[name]
        size = int(args[gathered]) if gathered is not None else 1
        self.totals.add(self._dim(str(args[group]), kind), kind, _tensor_bytes(args[0]) * size)


_COLLECTIVES: dict[Any, tuple[str | None, str]] = {}  # op -> (its namespace if a collective it records, its name)


def _collective(func) -> tuple[str | None, str]:
    if func not in _COLLECTIVES:
        namespace, name = func.namespace, func.__name__.split(".")[0]
        ops = {"c10d": C10D_OPS, "_c10d_functional": FUNCTIONAL_OPS}.get(namespace, ())
        _COLLECTIVES[func] = namespace if name in ops else None, name
    return _COLLECTIVES[func]


@dataclass
class StepAudit:
    """What one rank did in one step."""

    comm: list[tuple[str, str, int, int]]
    peak_live_bytes: int
    start_live_bytes: int
    peak_op: str
    forward_flops: float  # matmul-class ops (linears, matmuls, convolutions)
    backward_flops: float  # the same in the backward, recomputed forwards included
    attention_forward_flops: float
    attention_backward_flops: float
    placement: dict[str, int]
    resharded: dict[str, int] = field(default_factory=dict)  # op -> in-place reshards in the step
    fused_kernels: tuple[int, int] = (0, 0)  # (forward, backward) kernels inductor generated (execute/compiled.py)

    def to_dict(self) -> dict[str, Any]:
        return {
            "comm": [list(r) for r in self.comm],
            "peak_live_bytes": self.peak_live_bytes,
            "start_live_bytes": self.start_live_bytes,
            "peak_op": self.peak_op,
            "forward_flops": self.forward_flops,
            "backward_flops": self.backward_flops,
            "attention_forward_flops": self.attention_forward_flops,
            "attention_backward_flops": self.attention_backward_flops,
            "placement": self.placement,
            "resharded": dict(self.resharded),
            "fused_kernels": list(self.fused_kernels),
        }


def audited_step(
    trainer: Any,
    inputs: tuple,
    target: Any,
    *,
    groups: dict[frozenset, str],
    all_to_all: dict[frozenset, str] | None = None,
    named: dict[str, str] | None = None,
) -> tuple[torch.Tensor, StepAudit]:
    """Run ``trainer.train_step`` under the three recorders; return its loss and the audit."""
    comm, flops = CommRecorder(groups, all_to_all, named), MatmulFlops()
    gc.collect()  # the last step's cyclic garbage is not this step's memory
    memory = LiveBytes(existing_tensors(trainer))
    before, copied = Counter(RESHARDED), link_copies(trainer)
    with StepRecorders(memory, comm, flops):  # as ``with memory, comm, flops``, one mode (meters.py)
        loss = trainer.train_step(inputs, target)
    (mm_fwd, mm_bwd), (at_fwd, at_bwd) = flops.flops["matmul"], flops.flops["attention"]
    audit = StepAudit(
        comm=comm.totals.rows() + link_copies(trainer, since=copied),  # offload's (activation_offload.py)
        peak_live_bytes=memory.peak,
        start_live_bytes=memory.start,
        peak_op=memory.peak_op,
        forward_flops=mm_fwd,
        backward_flops=mm_bwd,
        attention_forward_flops=at_fwd,
        attention_backward_flops=at_bwd,
        placement=placement(trainer),
        resharded=dict(Counter(RESHARDED) - before),
        fused_kernels=compiled_kernels() if trainer.plan.compile or trainer.plan.tp_comm_overlap else (0, 0),
    )
    return loss, audit


def audit_ranks(trainer: Any, inputs: tuple, target: Any) -> list[dict] | None:
    """One audited step on every rank (:func:`audited_step`), the collectives of tied-weight
    groups counted as pp; every rank's record with its pipeline stage, on rank 0 (None elsewhere)."""
    from autoplan.execute.mesh import coordinates

    ties = {g.group_name: "pp" for g, _ in getattr(trainer.tie_sync, "pairs", []) if g is not None}  # None: one rank's
    experts = getattr(trainer, "experts", None)
    context = getattr(trainer, "context", None)
    groups = group_dims(trainer.mesh, ties, experts, grad_mesh=getattr(trainer, "grad_mesh", None))
    named = {context.kv_group.group_name: "cp"} if context is not None else edp_by_name(experts)
    trainer.sync_next()  # local SGD: the audited step is an outer-sync step, its all-reduce counted once
    with counted_rows(experts) as routed:  # the rows each rank's experts receive (routing_audit.py)
        _, audit = audited_step(
            trainer, inputs, target, groups=groups, all_to_all=all_to_all_dims(experts), named=named
        )
    everyone: list = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, {"stage": coordinates(trainer.mesh)["pp"], **audit.to_dict(), **routed})
    return everyone if dist.get_rank() == 0 else None


def relative_error(measured: float, predicted: float) -> float:
    if predicted == 0:
        return 0.0 if measured == 0 else math.inf
    return (measured - predicted) / predicted


#: (row, the StepAudit and StagePrediction field it compares)
FLOP_ROWS = (
    ("forward matmul FLOPs", "forward_flops"),
    ("backward matmul FLOPs", "backward_flops"),
    ("forward attention FLOPs", "attention_forward_flops"),
    ("backward attention FLOPs", "attention_backward_flops"),
)


def audit_rows(*, ranks: list[dict], predictions: list, stage_peak_bytes: list[float]) -> list[dict]:
    """Predicted beside measured, one row per rank and quantity (docs/cost-model.md, the audit): each collective
    (dim, kind), parameters held, matmul FLOPs, peak live bytes against the stage's predicted peak; under expert
    parallelism the rows its experts received, what follows them priced at those rows (routing_audit.py)."""
    rows = []
    for rank, audit in enumerate(ranks):
        stage = audit["stage"]
        pred, routed = predictions[stage], {PEAK: stage_peak_bytes[stage], **at_routing(predictions[stage], audit)}
        measured = {(d, k): (c, b) for d, k, c, b in audit["comm"]}
        for key in sorted(set(measured) | set(pred.comm)):
            (mc, mb), (pc, pb), what = measured.get(key, (0, 0)), pred.comm.get(key, (0, 0.0)), "comm " + " ".join(key)
            rows.append(_row(rank, stage, what, mb, routed.get(what, pb), UNITS.get(key[1], "bytes"), mc, pc))
        held = audit["placement"]["param_elements"]
        rows.append(_row(rank, stage, "parameters held", held, pred.param_elements, "elements"))
        for what, key in FLOP_ROWS:
            rows.append(_row(rank, stage, what, audit[key], routed.get(key, getattr(pred, key)), "flops"))
        rows.append(_row(rank, stage, "peak live memory", audit["peak_live_bytes"], routed[PEAK], "bytes"))
        reshards = sum(audit.get("resharded", {}).values())
        rows.append(_row(rank, stage, "in-place reshards", reshards, 0, "ops", reshards, 0))
        rows += _fused_rows(rank, stage, audit, pred)
    return rows + routing_rows(ranks, _row)


def _fused_rows(rank: int, stage: int, audit: dict, pred: Any) -> list[dict]:
    """Compiled blocks: the forward kernels inductor generated against the fused regions priced
    (cost/compute/fusion.py), and the backward's beside the same count (the price charges one
    backward pass per region; inductor also emits bias-gradient sums and split-backward copies)."""
    forward, backward = audit.get("fused_kernels", (0, 0))
    regions = getattr(pred, "fused_regions", 0)
    if not (forward or backward or regions):
        return []
    return [
        _row(rank, stage, "fused kernels forward", forward, regions, "kernels", forward, regions),
        _row(rank, stage, "fused kernels backward", backward, regions, "kernels", backward, regions),
    ]


def _row(
    rank: int,
    stage: int,
    what: str,
    measured: float,
    predicted: float,
    unit: str,
    measured_count: int | None = None,
    predicted_count: int | None = None,
) -> dict:
    counts_agree = predicted_count is None or measured_count == predicted_count  # DDP's bucket count is not priced
    return {
        "rank": rank,
        "stage": stage,
        "what": what,
        "measured_count": measured_count,
        "predicted_count": predicted_count,
        "measured": measured,
        "predicted": predicted,
        "unit": unit,
        "relative_error": relative_error(measured, predicted),
        "as_priced": measured == predicted and counts_agree,
    }
