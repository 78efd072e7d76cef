"""Time of one traced op on one device: a roofline with a saturating efficiency curve (the discussion:
docs/cost-model.md, "Compute", "FP8" and "FP8 recipes").

For a micro-batch that is ``batch_fraction`` of the traced global batch, the op's work divided
``shard`` ways (tensor parallelism):

    F = flops * batch_fraction / shard               (fwd_flops, or bwd_flops plus a fused attention's Q·K^T)
    F_attention = F * executed_fraction               GPU: the tiles a fused kernel visits (types/attention.py)
    B = io_bytes * batch_fraction / shard + param_bytes / shard
    t = max(F / (peak[dtype] * eff(F)), B / (mem_bw * memory_efficiency))   Williams, Waterman & Patterson 2009
    eff(F) = max_efficiency * F / (F + half_saturation_flops)              autoplan/types/profile.py
             (attention: ``attention[_te][_backward]``, the runtime's kernel and direction, else ``attention``)
    t_op = t + overhead (CPU backend),  max(t, overhead) (GPU backend)     profile device.op_overhead

io_bytes: forward ``in + out``; backward ``2 (in + out)`` for GEMM kinds, ``out + 2 in`` otherwise.
A measured ``op_table`` row wins over the model. An FP8 linear (autoplan/cost/compute/fp8.py: which
linears, the bytes each recipe's casts move, its GEMM's speed) runs at the FP8 peak times the
recipe's ``gemm_efficiency``, plus its casts at the memory roofline:

    t_fp8 = max(F / (peak['fp8'] eff_fp8(F) e_recipe), B / (mem_bw mem_eff)) + cast_bytes / shard / (mem_bw mem_eff)
"""

from __future__ import annotations

import math

from autoplan.cost.compute.dtypes import RunDtypes
from autoplan.cost.compute.fp8 import TENSORWISE, Fp8Recipe, fp8_cast_bytes, fp8_linear, weight_cast_bytes
from autoplan.errors import PlanError
from autoplan.types.attention import executed_fraction
from autoplan.types.graph import OpNode
from autoplan.types.profile import Profile

TENSOR_CORE_OPS = {"linear": "matmul", "matmul": "matmul", "attention": "attention", "conv": "conv"}
#: bytes per activation/weight element as stored and moved; fp8 keeps bf16's (module docstring)
PRECISION_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 2}
DROPOUT_MASK_BYTES = 1  # torch.bool mask of CUDA native_dropout (aten/src/ATen/native/cuda/Dropout.cu)
_PEAK_ORDER = {"fp32": ("fp32", "tf32"), "bf16": ("bf16", "fp16"), "fp16": ("fp16", "bf16"), "fp8": ("bf16", "fp16")}
_DTYPE_BYTES = {"float32": 4, "float": 4, "float64": 8, "double": 8, "float16": 2, "half": 2, "bfloat16": 2}


def peak_dtype(profile: Profile, precision: str) -> str:
    """The profile peak a precision runs its non-FP8 tensor-core ops at: fp32 -> fp32 (PyTorch's
    default has TF32 off for matmuls), bf16 -> bf16, fp16 -> fp16, each falling back to its
    16-bit twin; fp8 -> bf16's (only eligible linears use ``peak['fp8']``, :func:`fp8_linear`),
    and a profile without an fp8 peak cannot price fp8 (:func:`require_fp8_peak`)."""
    if precision not in PRECISION_BYTES:
        raise PlanError(f"precision '{precision}' is unknown; expected one of {', '.join(PRECISION_BYTES)}.")
    if precision == "fp8":
        require_fp8_peak(profile)
    order = _PEAK_ORDER[precision]
    for dtype in order:
        if dtype in profile.device.peak_flops:
            return dtype
    raise PlanError(
        f"profile '{profile.name}' has no peak FLOP/s for {precision}; "
        f"add device.peak_flops.{order[0]} or pick another precision."
    )


def require_fp8_peak(profile: Profile) -> None:
    """Raise a PlanError unless the profile's device has an FP8 tensor-core peak."""
    if "fp8" not in profile.device.peak_flops:
        raise PlanError(
            f"profile '{profile.name}' device '{profile.device.name}' has no FP8 peak (device.peak_flops.fp8): "
            "FP8 needs a GPU with FP8 tensor cores (H100, H200, ...); use precision bf16."
        )


def fp8_cast_s(
    node: OpNode,
    profile: Profile,
    *,
    precision: str,
    batch_fraction: float,
    shard: int,
    backward: bool,
    recipe: Fp8Recipe = TENSORWISE,
) -> float:
    """Seconds of an FP8 linear's scaling, casting and layout passes under ``recipe``
    (compute/fp8.py ``fp8_cast_bytes`` at the memory roofline, split by ``shard`` as the GEMM's
    bytes are), 0 for any other node."""
    if not fp8_linear(node, precision=precision, shard=shard):
        return 0.0
    moved = fp8_cast_bytes(node, batch_fraction=batch_fraction, backward=backward, recipe=recipe)
    return memory_time_s(profile, moved / shard)


def fp8_weight_cast_s(
    node: OpNode, profile: Profile, *, precision: str, shard: int, backward: bool, recipe: Fp8Recipe = TENSORWISE
) -> float:
    """Seconds of an FP8 linear's weight passes alone (compute/fp8.py ``weight_cast_bytes``), 0 for
    any other node. A matmul decomposed into tp token slices (async TP, autoplan/cost/tp/overlap.py)
    casts its weight once, not once per slice."""
    if not fp8_linear(node, precision=precision, shard=shard):
        return 0.0
    return memory_time_s(profile, weight_cast_bytes(node, backward=backward, recipe=recipe) / shard)


def op_time_s(
    node: OpNode,
    profile: Profile,
    *,
    precision: str,
    batch_fraction: float,
    shard: int = 1,
    backward: bool = False,
    input_bytes: float | None = None,
    needs_grad: bool = True,
    recipe: Fp8Recipe = TENSORWISE,
    moved: float | None = None,
    launches: bool = True,
    dtypes: RunDtypes | None = None,
) -> float:
    """Seconds for ``node`` (forward, or its backward) on one device; see the module docstring.

    ``input_bytes``: what the node reads, the traced outputs of its predecessors rescaled to
    ``precision`` (:func:`input_bytes_of`), for the whole traced batch; without it the bytes
    read are inferred from the op kind (a linear reads ``out * in/out``, others ``out``).
    ``needs_grad``: whether autograd runs a backward op for it (``Graph.grad_nodes``); only the
    host overhead of the backward depends on it. ``recipe``: the FP8 recipe (compute/fp8.py).
    ``moved`` (activation bytes for the traced batch) and ``launches`` replace the node's own as a
    member of a fused region (cost/compute/fusion.py). ``dtypes``: each node's run dtype (compute/dtypes.py).
    """
    device_s = _device_time_s(
        node,
        profile,
        precision=precision,
        batch_fraction=batch_fraction,
        shard=shard,
        backward=backward,
        input_bytes=input_bytes,
        recipe=recipe,
        moved=moved,
        dtypes=dtypes,
    )
    overhead_s = host_overhead_s(node, profile, backward=backward, needs_grad=needs_grad) if launches else 0.0
    return with_host_overhead(device_s, overhead_s, gpu=profile.backend == "nccl")


def _device_time_s(
    node: OpNode,
    profile: Profile,
    *,
    precision: str,
    batch_fraction: float,
    shard: int,
    backward: bool,
    input_bytes: float | None,
    recipe: Fp8Recipe,
    moved: float | None = None,
    dtypes: RunDtypes | None = None,
) -> float:
    """The roofline (or a measured op_table row) of the node's forward or backward, plus an FP8
    linear's casts (module docstring)."""
    fp8 = fp8_linear(node, precision=precision, shard=shard)
    cast_s = fp8_cast_s(
        node, profile, precision=precision, batch_fraction=batch_fraction, shard=shard, backward=backward, recipe=recipe
    )
    flops = executed_flops(node, backward=backward, gpu=profile.backend == "nccl") * batch_fraction / shard
    measured = _measured_s(
        node, profile, precision=precision, batch_fraction=batch_fraction, shard=shard, backward=backward
    )
    if measured is not None:
        return measured / (recipe.gemm_efficiency if fp8 else 1.0) + cast_s
    if moved is None:
        gpu = profile.backend == "nccl"
        moved = moved_bytes(
            node, precision=precision, gpu=gpu, backward=backward, input_bytes=input_bytes, dtypes=dtypes
        )
    # a view of a parameter (w.T feeding a matmul) moves nothing: its reader reads the weight
    weights = 0.0 if node.op == "view" else node.param_count * PRECISION_BYTES[precision] * (2.0 if backward else 1.0)
    bytes_moved = (moved * batch_fraction + weights) / shard
    compute_s = _flops_time_s(node, profile, flops=flops, precision=precision, fp8=fp8, backward=backward)
    compute_s /= recipe.gemm_efficiency if fp8 else 1.0
    return max(compute_s, memory_time_s(profile, bytes_moved)) + cast_s


def executed_flops(node: OpNode, *, backward: bool, gpu: bool) -> float:
    """The forward's (or backward's) FLOPs on the traced batch as the kernel runs them: on a GPU, an
    attention node's at the share of its scores the fused kernel visits (causal, window;
    autoplan/types/attention.py). A CPU profile's attention curve is measured on causal calls
    counted as the full rectangle (docs/profile-format.md), so it already holds the CPU kernel's
    skipping, and its FLOPs stay whole."""
    flops = executed_bwd_flops(node) if backward else float(node.fwd_flops)
    return flops * executed_fraction(node.attrs) if gpu and node.op == "attention" else flops


def executed_bwd_flops(node: OpNode) -> float:
    """The backward's FLOPs as the kernel runs them: the model FLOPs plus what a fused attention
    recomputes (Q·K^T once more, the ``bwd_recompute_flops`` attr, autoplan/trace/flops.py;
    Dao 2023, FlashAttention-2 section 4.1, counts the backward as 2.5x the forward)."""
    return node.bwd_flops + float(node.attrs.get("bwd_recompute_flops", 0.0))


def host_overhead_s(node: OpNode, profile: Profile, *, backward: bool, needs_grad: bool = True) -> float:
    """Host dispatch seconds of the node's forward or backward (module docstring); 0 without a
    measured ``op_overhead``, for graph inputs/outputs, shape arithmetic, and backward ops of
    nodes that need no gradient."""
    overhead = profile.device.op_overhead
    if overhead is None or node.op in ("input", "output") or not node.output_dtype:
        return 0.0
    if not backward:
        return overhead.forward_s
    return overhead.backward_s if needs_grad else 0.0


def with_host_overhead(device_s: float, overhead_s: float, *, gpu: bool) -> float:
    """CPU: the host computes, so the two add; GPU: asynchronous launches, the slower one shows."""
    return max(device_s, overhead_s) if gpu else device_s + overhead_s


def _flops_time_s(
    node: OpNode, profile: Profile, *, flops: float, precision: str, fp8: bool = False, backward: bool = False
) -> float:
    if flops <= 0:
        return 0.0
    device = profile.device
    op_class = TENSOR_CORE_OPS.get(node.op)
    dtype = peak_dtype(profile, precision)  # raises for fp8 on a profile without an fp8 peak
    if fp8:
        dtype = "fp8"
    if op_class is None:
        vector_peak = device.peak_flops.get("fp32") or min(device.peak_flops.values())
        return flops / (vector_peak * device.efficiency_for("matmul", dtype).max_efficiency)
    if op_class == "attention":  # the kernel's own curve (the runtime's, attrs "kernel"), its backward apart
        op_class += ("_te" if node.attrs.get("kernel") == "te" else "") + ("_backward" if backward else "")
    return flops / (device.peak_flops[dtype] * device.efficiency_for(op_class, dtype)(flops))


def memory_time_s(profile: Profile, bytes_moved: float) -> float:
    """A memory-bound pass over ``bytes_moved`` bytes: bytes / (memory bandwidth * memory efficiency)."""
    device = profile.device
    return bytes_moved / (device.memory_bandwidth_bytes_per_s * device.memory_efficiency)


def activation_scale(node: OpNode, *, precision: str, dtypes: RunDtypes | None = None) -> float:
    """Bytes per element in the run over bytes per element as traced (1 for non-floats): the node's
    run dtype under the plan's policy (compute/dtypes.py), else every float in ``precision``."""
    if dtypes is not None:
        return dtypes.scale(node)
    traced = _DTYPE_BYTES.get(node.output_dtype.replace("torch.", ""))
    return PRECISION_BYTES[precision] / traced if traced else 1.0


def is_dropout(node: OpNode) -> bool:
    """A dropout that keeps a mask (it saved at least one output's worth of bytes)."""
    return node.op == "elementwise" and "dropout" in node.target.lower() and node.saved_bytes >= node.output_bytes > 0


def mask_bytes(node: OpNode, *, precision: str, gpu: bool, dtypes: RunDtypes | None = None) -> float:
    """Bytes of a dropout's mask in the run: 1 per element on a GPU (CUDA native_dropout's bool
    mask), else the traced noise tensor rescaled; 0 for any other node."""
    if not is_dropout(node):
        return 0.0
    if gpu:
        return float(math.prod(node.output_shape)) * DROPOUT_MASK_BYTES
    return node.output_bytes * activation_scale(node, precision=precision, dtypes=dtypes)


def saved_activation_bytes(node: OpNode, *, precision: str, gpu: bool, dtypes: RunDtypes | None = None) -> float:
    """``node.saved_bytes`` in the run's precision for the traced batch: floating tensors are
    rescaled, a dropout mask is counted by :func:`mask_bytes` (module docstring)."""
    traced_mask = float(node.output_bytes) if is_dropout(node) else 0.0
    mask = mask_bytes(node, precision=precision, gpu=gpu, dtypes=dtypes)
    if dtypes is not None:  # autocast's low copies of an fp32 output (compute/dtypes.py saved_bytes)
        return dtypes.saved_bytes(node, node.saved_bytes - traced_mask) + mask
    return (node.saved_bytes - traced_mask) * activation_scale(node, precision=precision) + mask


def input_bytes_of(predecessors: list[OpNode], *, precision: str, dtypes: RunDtypes | None = None) -> float:
    """What a node reads: its predecessors' traced outputs, each rescaled to the run's dtype."""
    return sum(p.output_bytes * activation_scale(p, precision=precision, dtypes=dtypes) for p in predecessors)


def moved_bytes(
    node: OpNode,
    *,
    precision: str,
    gpu: bool,
    backward: bool,
    input_bytes: float | None = None,
    dtypes: RunDtypes | None = None,
) -> float:
    """Activation bytes the node's forward (or backward) reads and writes for the traced batch,
    in ``precision``; weights excluded (module docstring)."""
    if node.op == "view" or not node.output_bytes:  # a view, or an op with no tensor out (a metadata assert)
        return 0.0
    out = node.output_bytes * activation_scale(node, precision=precision, dtypes=dtypes)
    attrs = node.attrs
    if node.op == "attention":
        kv = attrs.get("num_kv_heads") or attrs.get("num_heads") or 1
        fwd = out * (2.0 + 2.0 * kv / (attrs.get("num_heads") or 1))
        return 2.0 * fwd if backward else fwd
    if node.op in ("loss", "reduction"):
        fwd = out + node.saved_bytes * activation_scale(node, precision=precision, dtypes=dtypes)
        return 2.0 * fwd if backward else fwd
    read = _read_bytes(node, out, input_bytes)
    if node.op in TENSOR_CORE_OPS:
        return 2.0 * (read + out) if backward else read + out
    mask = mask_bytes(node, precision=precision, gpu=gpu, dtypes=dtypes)
    if backward:  # read dY and the saved operand (the mask for dropout), write dX
        return out + read + (mask if mask else read)
    return read + out + mask


def _read_bytes(node: OpNode, out: float, input_bytes: float | None) -> float:
    if input_bytes is not None:
        return input_bytes
    attrs = node.attrs
    if node.op == "linear" and attrs.get("in_features") and attrs.get("out_features"):
        return out * attrs["in_features"] / attrs["out_features"]
    return out


def _measured_s(
    node: OpNode, profile: Profile, *, precision: str, batch_fraction: float, shard: int, backward: bool
) -> float | None:
    """A measured op_table time for this linear's forward or backward, if the profile has a row
    of its shape (module docstring: ``fwd+bwd`` rows split by FLOPs)."""
    if not profile.device.op_table:
        return None
    keys = _linear_keys(node, batch_fraction=batch_fraction, shard=shard)
    if not keys:
        return None
    dtype = peak_dtype(profile, precision)
    if fp8_linear(node, precision=precision, shard=shard):
        dtype = "fp8"  # an FP8 GEMM's row (the casts are priced on top, _device_time_s)
    total = node.fwd_flops + node.bwd_flops
    for row in profile.device.op_table:
        if row.op not in ("linear", "matmul") or row.dtype != dtype:
            continue
        if row.shape in keys and node.fwd_flops:
            return row.time_s * node.bwd_flops / node.fwd_flops if backward else row.time_s
        if row.shape.endswith(",fwd+bwd") and row.shape[: -len(",fwd+bwd")] in keys and total:
            return row.time_s * (node.bwd_flops if backward else node.fwd_flops) / total
    return None


def _linear_keys(node: OpNode, *, batch_fraction: float, shard: int) -> set[str]:
    """op_table shape keys a linear node's sharded GEMM can have (either dim split by tp)."""
    k, n = node.attrs.get("in_features"), node.attrs.get("out_features")
    if node.op != "linear" or not node.output_shape or not k or not n:
        return set()
    m = int(round(math.prod(node.output_shape[:-1]) * batch_fraction))
    return {f"m={m},n={n // shard},k={k}", f"m={m},n={n},k={k // shard}"}
