"""The dtype each node's output has in the run: one statement per (graph, precision policy) that every
activation price reads (docs/cost-model.md, "Activation dtypes").

A node's run dtype d(n), propagated in the graph's order from the inputs (PyTorch's autocast, "Autocast
Op Reference" in the torch.amp docs, and its op lists in aten/src/ATen/autocast_mode.{h,cpp}):

    input             floating: the low dtype under cast_params (FSDP2's cast_forward_inputs), else as traced
    explicit cast     its target: a constant dtype as traced, or the dtype of the tensor it copies (``.to(x.dtype)``)
    lower-precision   linear, matmul, conv, attention (mm, bmm, addmm, baddbmm, sdpa ...): low
    fp32 list         every loss, and the device's fp32 ops (CUDA: layer/rms/group norm, softmax, pow ...): fp32
    embedding         its weight's dtype: low under cast_params, else as traced
    norm (unlisted)   its input's (CPU layer/rms norm keep the input dtype beside an fp32 weight)
    everything else   type promotion over its floating inputs and weights, a 0-dim tensor only among 0-dims

scale(n) = bytes(d(n)) / bytes(traced dtype of n); 1 for non-floating outputs. Without a policy (fp32
plans, and runtimes that cast the whole model: Megatron's Float16Module, torchtitan's FSDP2, DeepSpeed's
bf16 engine) every floating node scales to the precision's bytes, as before this statement.
``autocast`` is autoplan's executor (execute/precision.py): fp32 weights under autocast unless FSDP2
(ZeRO-2/3 over dp x cp > 1) casts them (cast_params). Memoised on the graph per policy.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from autoplan.types.graph import Graph, OpNode
from autoplan.types.plan import Plan

DTYPE_BYTES = {"float32": 4, "float": 4, "float64": 8, "double": 8, "float16": 2, "half": 2, "bfloat16": 2}
_LOW = {"bf16": "bfloat16", "fp16": "float16", "fp8": "bfloat16"}  # fp8 computes its non-GEMM ops in bf16
_LOWER_KINDS = ("linear", "matmul", "conv", "attention")  # AT_FORALL_LOWER_PRECISION_FP, KERNEL_CPU lower_precision_fp
_RNN_MODULES = ("LSTM", "GRU", "RNN")  # torch.nn's recurrent modules, run by cuDNN or oneDNN
_RNN_OPS = ("lstm", "gru", "rnn_tanh", "rnn_relu", "mkldnn_rnn_layer")


def _onednn_runs(dtype: str) -> bool:
    """Whether this CPU's oneDNN has RNN kernels for ``dtype`` (torch's checks of the ISA)."""
    check = {"bfloat16": "_is_mkldnn_bf16_supported", "float16": "_is_mkldnn_fp16_supported"}.get(dtype)
    if not check:
        return False
    import torch  # only where an RNN is priced on a CPU: cost/ imports no torch (docs/architecture.md)

    try:
        return torch.backends.mkldnn.is_available() and getattr(torch.ops.mkldnn, check)()
    except (AttributeError, RuntimeError):
        return False


#: AT_FORALL_FP32 and AT_FORALL_FP32_SET_OPT_DTYPE (autocast_mode.h, CUDA), the losses and FFTs of KERNEL_CPU fp32
_FP32_CUDA = frozenset(
    "acos asin cosh erfinv exp expm1 log log10 log2 log1p reciprocal rsqrt sinh tan pow softplus layer_norm "
    "native_layer_norm rms_norm group_norm frobenius_norm nuclear_norm cosine_similarity dist pdist cdist renorm "
    "logsumexp prod softmax log_softmax cumprod cumsum linalg_vector_norm linalg_matrix_norm sum norm".split()
)
_FP32_CPU = frozenset(
    "avg_pool3d binary_cross_entropy grid_sampler polar prod quantile nanquantile stft cdist trace max_pool3d "
    "adaptive_avg_pool3d adaptive_max_pool3d reflection_pad1d reflection_pad2d replication_pad1d replication_pad2d "
    "replication_pad3d fft_fft fft_ifft fft_rfft fft_irfft".split()
)
_PROMOTE = {
    "cuda": frozenset(
        "addcdiv addcmul atan2 bilinear cross dot vdot grid_sampler index_put tensordot scatter_add".split()
    ),
    "cpu": frozenset(("stack", "cat", "index_copy")),
}


@dataclass(frozen=True)
class DtypePolicy:
    """How a run computes: ``low`` the 16-bit dtype, weights (and floating inputs) cast to it or not,
    torch.autocast around the forward for ``device`` ('cuda' or 'cpu') or not."""

    low: str
    cast_params: bool
    device: str
    autocast: bool = True


def dtype_policy(plan: Plan, *, backend: str) -> DtypePolicy | None:
    """The policy ``plan`` runs under (module docstring); None where every activation is in the
    precision: fp32, or a runtime that casts the whole model."""
    dp_cp, zero = plan.dp * plan.cp, plan.zero_stage
    return policy_for(precision=plan.precision, runtime=plan.runtime, dp_cp=dp_cp, zero_stage=zero, backend=backend)


def policy_for(*, precision: str, runtime: str, dp_cp: int, zero_stage: int, backend: str) -> DtypePolicy | None:
    """:func:`dtype_policy` from the fields it reads: what the search asks per ZeRO choice before a plan exists."""
    if precision not in _LOW or runtime != "autoplan":
        return None
    fsdp = dp_cp > 1 and zero_stage >= 2  # execute/data_parallel.py dp_mode == "fsdp"
    return DtypePolicy(low=_LOW[precision], cast_params=fsdp, device="cuda" if backend == "nccl" else "cpu")


class RunDtypes:
    """Each node's run dtype under one policy, and the factor that turns its traced bytes into run bytes."""

    def __init__(self, graph: Graph, policy: DtypePolicy) -> None:
        self.graph, self.policy = graph, policy
        self.dtypes: dict[str, str] = {}
        preds, succs = graph.adjacency()
        for node in graph.nodes:  # execution order: a node's inputs come first
            self.dtypes[node.name] = self._dtype(node, [graph.node(p) for p in preds[node.name]])
        self.readers = {n.name: self._readers(n, succs) for n in graph.nodes if self._copied(n)}

    def _copied(self, node: OpNode) -> bool:
        """Autocast casts this output to the low dtype for some reader: floating, wider than low."""
        dtype = self.dtypes[node.name]
        return self.policy.autocast and dtype in DTYPE_BYTES and DTYPE_BYTES[dtype] > DTYPE_BYTES[self.policy.low]

    def _readers(self, node: OpNode, succs: dict[str, list[str]]) -> tuple[int, bool]:
        """(lower-precision ops reading the output, through views: each casts and saves its own low copy;
        whether any other op reads it, which may save the output itself)."""
        preds = self.graph.adjacency()[0]
        lower, other, stack = 0, False, [(r, node.name) for r in succs[node.name]]
        while stack:
            name, source = stack.pop()
            reader = self.graph.node(name)
            if preds[name][:1] != [source] or not reader.output_bytes:
                continue  # reads only its size, or shape arithmetic: not the data
            cast = "cast_dtype" in reader.attrs or "cast_like" in reader.attrs
            if reader.op == "view" and not cast:
                stack.extend((r, name) for r in succs[name])
            elif self._lowered(reader):
                lower += 1
            elif not cast:
                other = True
        return lower, other

    def saved_bytes(self, node: OpNode, traced: float) -> float:
        """``traced`` saved bytes of ``node`` (its output among them when saved) in the run: under autocast an
        output wider than low that lower-precision ops read is saved as one low copy per such op (its own
        storage too when another op reads it), the rest rescaled (:meth:`scale`)."""
        lower, other = self.readers.get(node.name, (0, True))
        if not lower or traced < node.output_bytes:
            return traced * self.scale(node)
        element = node.output_bytes / DTYPE_BYTES[node.output_dtype.replace("torch.", "")]
        own = node.output_bytes * self.scale(node) if other else 0.0
        return (traced - node.output_bytes) * self.scale(node) + own + lower * element * DTYPE_BYTES[self.policy.low]

    def dtype(self, node: OpNode) -> str:
        return self.dtypes.get(node.name, node.output_dtype)

    def bytes(self, node: OpNode) -> int:
        """Bytes per element of the node's output in the run."""
        return DTYPE_BYTES.get(self.dtype(node), 1)

    def operand_bytes(self, node: OpNode, index: int) -> int:
        """Bytes per element of the node's ``index``-th input in the run (its own output's when it has fewer)."""
        preds = self.graph.adjacency()[0][node.name]
        return self.bytes(self.graph.node(preds[index])) if index < len(preds) else self.bytes(node)

    def recast_bytes(self, node: OpNode, consumer: OpNode) -> float:
        """Bytes of ``node``'s output (traced batch) in ``consumer``'s run dtype when the two differ, else 0:
        the copy autocast makes for an op computing in another dtype (a loss in fp32 on bf16 logits), and
        the gradient that op's backward makes before the copy's backward casts it back."""
        if self.dtype(node) == self.dtype(consumer) or self.dtype(consumer) not in DTYPE_BYTES:
            return 0.0
        traced = DTYPE_BYTES.get(node.output_dtype.replace("torch.", ""))
        return node.output_bytes / traced * self.bytes(consumer) if traced else 0.0

    def scale(self, node: OpNode) -> float:
        traced = DTYPE_BYTES.get(node.output_dtype.replace("torch.", ""))
        return DTYPE_BYTES[self.dtype(node)] / traced if traced else 1.0

    def _dtype(self, node: OpNode, preds: list[OpNode]) -> str:
        traced = node.output_dtype.replace("torch.", "")
        if traced not in DTYPE_BYTES:
            return traced
        policy, low = self.policy, self.policy.low
        if node.op == "input":
            return low if policy.cast_params else traced
        if "cast_dtype" in node.attrs or "cast_like" in node.attrs:
            return self._cast(node, traced)
        name = torch_name(node)
        if policy.autocast and self._lowered(node):
            return low
        if policy.autocast and (node.op == "loss" or name in (_FP32_CUDA if policy.device == "cuda" else _FP32_CPU)):
            return "float32"
        if node.op == "embedding":
            return self._param_dtype(node, traced)
        floating = [p for p in preds if self.dtypes.get(p.name) in DTYPE_BYTES]
        if node.op == "norm" and floating:
            return self.dtypes[floating[0].name]
        return self._promote(node, floating, traced)

    def _lowered(self, node: OpNode) -> bool:
        """Whether autocast runs ``node`` in the low dtype: its lower-precision kinds, and an RNN (cuDNN's on a GPU;
        oneDNN's ``mkldnn_rnn_layer`` on a CPU with its kernels for the dtype, else torch's native RNN, which stays
        fp32: execute/precision.py). A bf16 LSTM's pipeline boundary was priced at fp32's bytes, twice its sends."""
        if node.op in _LOWER_KINDS:
            return True
        rnn = node.attrs.get("module_type") in _RNN_MODULES or torch_name(node) in _RNN_OPS
        return rnn and (self.policy.device == "cuda" or _onednn_runs(self.policy.low))

    def _cast(self, node: OpNode, traced: str) -> str:
        like = node.attrs.get("cast_like")
        if like in self.dtypes:
            return self.dtypes[like]
        if like in self.graph.parameters:
            return self.policy.low if self.policy.cast_params else self.graph.parameters[like].dtype
        return node.attrs.get("cast_dtype", traced)

    def _param_dtype(self, node: OpNode, traced: str) -> str:
        if not node.param_names:
            return traced
        return self.policy.low if self.policy.cast_params else (node.param_dtype or traced)

    def _promote(self, node: OpNode, floating: list[OpNode], traced: str) -> str:
        """torch.result_type over the floating inputs and weights: widest wins; 0-dim tensors count
        only when every operand is 0-dim (a plain op, or autocast's promote list)."""
        shaped = [p for p in floating if p.output_shape] or floating
        dtypes = [self.dtypes[p.name] for p in shaped]
        if node.param_names:
            dtypes.append(self._param_dtype(node, traced))
        if not dtypes:
            return traced  # made from constants and buffers, which no policy casts
        return result_type(dtypes)


def result_type(dtypes: list[str]) -> str:
    """torch's promotion among floating dtypes: the widest, and bf16 with fp16 gives fp32."""
    widest = max(DTYPE_BYTES[d] for d in dtypes)
    kinds = sorted({d for d in dtypes if DTYPE_BYTES[d] == widest})
    return "float32" if kinds == ["bfloat16", "float16"] else kinds[0]


def torch_name(node: OpNode) -> str:
    """The ATen-style name of a node's op: ``aten.add.Tensor`` -> ``add``, ``RMSNorm`` -> ``rms_norm``."""
    target = node.target
    if target.startswith("aten."):
        return target.split(".")[1]
    if target[:1].isupper():
        return re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "_", target).lower()
    return target


def dtypes_of(graph: Graph, policy: DtypePolicy | None) -> RunDtypes | None:
    """:func:`run_dtypes`, or None without a policy (every float in the precision)."""
    return None if policy is None else run_dtypes(graph, policy)


def plan_dtypes(graph: Graph, plan: Plan, *, backend: str) -> RunDtypes | None:
    """Each activation's run dtype under ``plan`` on a ``backend`` profile (None: all in its precision)."""
    return dtypes_of(graph, dtype_policy(plan, backend=backend))


def run_dtypes(graph: Graph, policy: DtypePolicy) -> RunDtypes:
    """:class:`RunDtypes` of ``graph`` under ``policy``, built once per graph and policy."""
    cache = graph.__dict__.setdefault("_run_dtypes_cache", {})
    if policy not in cache:
        cache[policy] = RunDtypes(graph, policy)
    return cache[policy]
