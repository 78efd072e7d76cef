"""Two meters of the execution audit (execute/job/audit.py): live tensor bytes and matmul FLOPs.

- :class:`LiveBytes`: the peak of live tensor bytes on this rank, tracked by tensor lifetime
  (each storage counted from the op that made it until Python frees it), starting from the
  parameters, gradients, buffers, optimizer states and the pipeline's receive slots alive when
  the step begins (execute/job/receive_buffers.py); a candidate
  peak is re-read from the storages' sizes, since FSDP2 frees by resizing storages in place.
  The op running at the peak is kept (``peak_op``). torch's own ``MemTracker`` refuses a
  module called twice in one tracked window, which every micro-batched or pipelined step does.
- :class:`MatmulFlops`: FLOPs of matmul-class ops and, apart, of attention kernels
  (``torch.utils.flop_counter``'s formulas), split into forward and backward (the backward
  includes recomputed forwards, which run inside it). A flash attention's backward recomputes
  the scores: torch counts it 2.5x its forward, where the tracer's model FLOPs count 2x.
  Grouped GEMMs (``aten._grouped_mm``, the experts of Hugging Face MoE models) have no entry in
  torch's registry; :func:`grouped_mm_flops` counts them, 2 FLOPs per multiply-add of every group.

Both return ``NotImplemented`` for an op on DTensors (:func:`on_dtensors`), so DTensor runs it
and its local ops reach the meters on plain tensors.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any, Iterable

import torch
from torch.distributed.tensor import DTensor
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.flop_counter import flop_registry, sdpa_backward_flop_count, sdpa_flop_count

MATMUL_OPS = {"mm", "addmm", "bmm", "baddbmm", "convolution", "convolution_backward", "_grouped_mm", "_scaled_mm"}
ATTENTION_OPS = {
    "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_cudnn_attention",
    "_flash_attention_forward",
    "_efficient_attention_forward",
    "_scaled_dot_product_flash_attention_backward",
    "_scaled_dot_product_efficient_attention_backward",
    "_scaled_dot_product_cudnn_attention_backward",
    "_flash_attention_backward",
    "_efficient_attention_backward",
}
#: torch's flop registry has no entry for the CPU flash kernels; their arguments lead with (q, k, v) and
#: (grad_out, q, k, v), as the CUDA ones' do
CPU_ATTENTION = {
    "_scaled_dot_product_flash_attention_for_cpu": "forward",
    "_scaled_dot_product_flash_attention_for_cpu_backward": "backward",
}
ALL_ATTENTION_OPS = ATTENTION_OPS | set(CPU_ATTENTION)


def local_tensor(t: torch.Tensor) -> torch.Tensor:
    return t._local_tensor if isinstance(t, DTensor) else t


class LiveBytes(TorchDispatchMode):
    """Peak bytes of live tensor storages on this rank while active (module docstring)."""

    def __init__(self, existing: Iterable[torch.Tensor] = ()):
        super().__init__()
        self.live: dict[int, int] = {}
        self._refs: dict[int, weakref.ref] = {}
        self.current = self.peak = 0
        self._peak_at: Any = ""
        self._op: Any = "before the step"  # (op, in the backward) once one ran: named at the peak only
        # a storage may die on another thread (the overlapped F&B's backward half, execute/overlap_f_b.py) while
        # this one tracks or re-reads: the counts change under one lock
        self._lock = threading.RLock()
        for tensor in existing:
            self._track(tensor)
        self.start = self.current

    def _track(self, tensor: Any) -> None:
        if not isinstance(tensor, torch.Tensor):
            return
        tensor = local_tensor(tensor)
        if tensor.device.type == "meta":
            return
        if tensor.is_sparse:  # a sparse embedding gradient holds no storage: its indices' and values' do
            self._track(tensor._indices())
            self._track(tensor._values())
            return
        storage = tensor.untyped_storage()
        key = storage._cdata
        with self._lock:
            if key in self.live:
                return
            size = storage.nbytes()
            self.live[key] = size
            self.current += size
            self._refs[key] = weakref.ref(storage, lambda _ref, k=key: self._free(k))
            if self.current > self.peak and self._resync() > self.peak:
                self.peak, self._peak_at = self.current, self._op

    def _resync(self) -> int:
        """The current bytes, re-read from every live storage: FSDP2 frees and re-allocates its
        unsharded parameters by resizing their storages in place (``resize_(0)``), which no
        dispatched op shows; a new peak is only taken on these exact sizes."""
        for key, ref in list(self._refs.items()):
            storage = ref()
            if storage is not None:
                self.live[key] = storage.nbytes()
        self.current = sum(self.live.values())
        return self.current

    def _free(self, key: int) -> None:
        with self._lock:
            size = self.live.pop(key, 0)
            self._refs.pop(key, None)
            self.current -= size

    @property
    def peak_op(self) -> str:
        """The op running at the peak and its pass, e.g. 'addmm (forward)': the audit says where the peak happened."""
        if isinstance(self._peak_at, str):
            return self._peak_at
        func, backward = self._peak_at
        return f"{func._overloadpacket.__name__} ({'backward' if backward else 'forward'})"

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if on_dtensors(types):
            return NotImplemented
        out = func(*args, **(kwargs or {}))
        self.record(func, out)
        return out

    def record(self, func, out: Any) -> None:
        """Track the storages of ``out``, what ``func`` returned (a lone tensor without flattening it)."""
        self._op = func, torch._C._current_graph_task_id() != -1
        for leaf in (out,) if isinstance(out, torch.Tensor) else tree_flatten(out)[0]:
            self._track(leaf)


class MatmulFlops(TorchDispatchMode):
    """Forward and backward FLOPs of matmul-class ops, and of attention kernels apart, on this
    rank (module docstring)."""

    def __init__(self):
        super().__init__()
        self.flops = {"matmul": [0.0, 0.0], "attention": [0.0, 0.0]}  # kind -> [forward, backward]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if on_dtensors(types):
            return NotImplemented
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        self.record(func, args, kwargs, out)
        return out

    def record(self, func, args: tuple, kwargs: dict, out: Any) -> None:
        """Count ``func``'s FLOPs if it is a matmul-class or attention op."""
        kind, name = _flop_kind(func)
        if kind is not None:
            phase = 0 if torch._C._current_graph_task_id() == -1 else 1
            self.flops[kind][phase] += _op_flops(func, name, args, kwargs, out)


class StepRecorders(TorchDispatchMode):
    """The audit's recorders as one mode, recording what ``with memory, comm, flops`` does (audit.py
    ``audited_step``) with one Python dispatch an op instead of three (each a mode-stack pop and push and a
    dynamo-disabled call): the collective noted before it runs, then the outputs tracked, then the FLOPs counted,
    as down and back up that stack. There the live-bytes mode alone, below the others, saw the ops the collective
    recorder runs itself (a sparse all-reduce's coalesce): here it is entered around them. ``comm``: an
    audit.py ``CommRecorder`` (its all-reduce patch for gloo's callback threads held while this mode is)."""

    def __init__(self, memory: LiveBytes, comm: Any, flops: MatmulFlops):
        super().__init__()
        self.memory, self.comm, self.flops = memory, comm, flops

    def __enter__(self):
        self.comm.patch()
        return super().__enter__()

    def __exit__(self, *exc):
        self.comm.unpatch()
        return super().__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if on_dtensors(types):
            return NotImplemented
        kwargs = kwargs or {}
        if self.comm.runs_ops(func):
            with self.memory:
                self.comm.record(func, args)
        else:
            self.comm.record(func, args)
        out = func(*args, **kwargs)
        self.memory.record(func, out)
        self.flops.record(func, args, kwargs, out)
        return out


_KINDS: dict[Any, tuple[str | None, str]] = {}  # op -> (its FLOP kind or None, its name): looked up once an op


def _flop_kind(func) -> tuple[str | None, str]:
    if func not in _KINDS:
        name = func._overloadpacket.__name__
        _KINDS[func] = "matmul" if name in MATMUL_OPS else "attention" if name in ALL_ATTENTION_OPS else None, name
    return _KINDS[func]


def _op_flops(func, name: str, args: tuple, kwargs: dict, out: Any) -> float:
    if name in CPU_ATTENTION:
        if CPU_ATTENTION[name] == "forward":
            return float(sdpa_flop_count(args[0].shape, args[1].shape, args[2].shape))
        return float(sdpa_backward_flop_count(args[0].shape, args[1].shape, args[2].shape, args[3].shape))
    if name == "_grouped_mm":
        return grouped_mm_flops(args[0], args[1], out)
    packet = func._overloadpacket
    return float(flop_registry[packet](*args, **kwargs, out_val=out)) if packet in flop_registry else 0.0


def grouped_mm_flops(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> float:
    """FLOPs of ``torch._grouped_mm(a, b, offs)``: groups along the rows of a 2-D ``a`` against a
    3-D ``b`` (or the other way round, or 3-D x 3-D) each contract ``a``'s last dim, so 2 x the
    output's elements x K; 2-D x 2-D groups split the contraction itself (a weight gradient), so
    2 x M x K_total x N."""
    if a.dim() == 2 and b.dim() == 2:
        return 2.0 * a.shape[0] * a.shape[1] * b.shape[1]
    return 2.0 * out.numel() * a.shape[-1]


_ON_DTENSORS: dict[tuple, bool] = {}  # the operand types an op had -> whether one is a DTensor: answered once


def on_dtensors(types: tuple) -> bool:
    """Whether an op has DTensor operands: then DTensor runs it first (module docstring)."""
    key = tuple(types)
    if key not in _ON_DTENSORS:
        _ON_DTENSORS[key] = any(issubclass(t, DTensor) for t in key)
    return _ON_DTENSORS[key]
