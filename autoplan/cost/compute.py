"""Time of one traced op on one device: a roofline with a saturating efficiency curve.

For a micro-batch that is ``batch_fraction`` of the traced global batch, with the op's work
divided ``shard`` ways (tensor parallelism):

    F = flops * batch_fraction / shard                       (fwd_flops, or bwd_flops for backward)
    B = io_bytes * batch_fraction / shard + param_bytes / shard
    t = max( F / (peak[dtype] * eff(F)),  B / (mem_bw * memory_efficiency) )
    eff(F) = max_efficiency * F / (F + half_saturation_flops)        (autoplan/types/profile.py)

This is the roofline model (Williams, Waterman & Patterson, CACM 2009) with the profile's
efficiency curve for small ops. Tensor-core op kinds (linear, matmul, attention, conv) use
``peak[dtype]`` and the efficiency curve of their op class in that dtype
(``DeviceSpec.efficiency_for``, falling back to matmul's); the rest (norms, element-wise ops,
softmax, losses) use the vector peak (``peak['fp32']``) at ``max_efficiency`` and are
in practice bound by memory.

Bytes moved (the graph records outputs, not inputs, so inputs are inferred from the op):
linear reads ``out * in_features/out_features`` and writes ``out``; attention reads q, k, v
(k and v scaled by num_kv_heads/num_heads) and writes o; other ops read about as much as
they write (2 * out), losses and reductions read their saved input. Backward moves twice
the forward's activation bytes (read the output gradient and the saved tensors, write the
input gradient) plus the weight gradient. Floating-point activations are rescaled from the
traced dtype to the precision's (2 bytes for bf16/fp16, 4 for fp32), and weights are read
in the compute dtype. A measured ``op_table`` row for the op's kind, shape and dtype wins
over the model (backward: the row times bwd_flops / fwd_flops).
"""
from __future__ import annotations

from autoplan.errors import PlanError
from autoplan.types.graph import OpNode
from autoplan.types.profile import Profile

TENSOR_CORE_OPS = {"linear": "matmul", "matmul": "matmul", "attention": "attention", "conv": "conv"}
PRECISION_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
_DTYPE_BYTES = {"float32": 4, "float": 4, "float64": 8, "double": 8, "float16": 2, "half": 2, "bfloat16": 2}


def peak_dtype(profile: Profile, precision: str) -> str:
    """The profile peak a precision runs matmuls at: fp32 -> fp32 (PyTorch's default has TF32
    off for matmuls), bf16 -> bf16, fp16 -> fp16, each falling back to its 16-bit twin."""
    if precision not in PRECISION_BYTES:
        raise PlanError(f"precision '{precision}' is unknown; expected one of {', '.join(PRECISION_BYTES)}.")
    order = {"fp32": ("fp32", "tf32"), "bf16": ("bf16", "fp16"), "fp16": ("fp16", "bf16")}[precision]
    for dtype in order:
        if dtype in profile.device.peak_flops:
            return dtype
    raise PlanError(f"profile '{profile.name}' has no peak FLOP/s for {precision}; add device.peak_flops.{order[0]} or pick another precision.")


def op_time_s(node: OpNode, profile: Profile, *, precision: str, batch_fraction: float,
              shard: int = 1, backward: bool = False) -> float:
    """Seconds for ``node`` (forward, or its backward) on one device; see the module docstring."""
    flops = (node.bwd_flops if backward else node.fwd_flops) * batch_fraction / shard
    measured = _measured_s(node, profile, precision=precision, batch_fraction=batch_fraction, shard=shard)
    if measured is not None:
        return measured * node.bwd_flops / node.fwd_flops if backward and node.fwd_flops else measured
    bytes_moved = _bytes_moved(node, precision=precision, batch_fraction=batch_fraction, shard=shard, backward=backward)
    return max(_flops_time_s(node, profile, flops=flops, precision=precision), _memory_time_s(profile, bytes_moved))


def _flops_time_s(node: OpNode, profile: Profile, *, flops: float, precision: str) -> float:
    if flops <= 0:
        return 0.0
    device = profile.device
    op_class = TENSOR_CORE_OPS.get(node.op)
    dtype = peak_dtype(profile, precision)
    if op_class is None:
        vector_peak = device.peak_flops.get("fp32") or min(device.peak_flops.values())
        return flops / (vector_peak * device.efficiency_for("matmul", dtype).max_efficiency)
    return flops / (device.peak_flops[dtype] * device.efficiency_for(op_class, dtype)(flops))


def _memory_time_s(profile: Profile, bytes_moved: float) -> float:
    device = profile.device
    return bytes_moved / (device.memory_bandwidth_bytes_per_s * device.memory_efficiency)


def activation_scale(node: OpNode, *, precision: str) -> float:
    """Bytes per element in ``precision`` over bytes per element as traced (1 for non-floats)."""
    traced = _DTYPE_BYTES.get(node.output_dtype.replace("torch.", ""))
    return PRECISION_BYTES[precision] / traced if traced else 1.0


def io_bytes(node: OpNode) -> float:
    """Activation bytes one forward of the node reads and writes, as traced (module doc)."""
    out = float(node.output_bytes)
    attrs = node.attrs
    if node.op == "view":
        return 0.0
    if node.op == "linear" and attrs.get("in_features") and attrs.get("out_features"):
        return out * (1.0 + attrs["in_features"] / attrs["out_features"])
    if node.op == "attention":
        kv = attrs.get("num_kv_heads") or attrs.get("num_heads") or 1
        heads = attrs.get("num_heads") or 1
        return out * (2.0 + 2.0 * kv / heads)
    if node.op in ("loss", "reduction"):
        return out + float(node.saved_bytes)
    return 2.0 * out


def _bytes_moved(node: OpNode, *, precision: str, batch_fraction: float, shard: int, backward: bool) -> float:
    activations = io_bytes(node) * activation_scale(node, precision=precision) * batch_fraction / shard
    weights = node.param_count * PRECISION_BYTES[precision] / shard
    if backward:
        return 2.0 * activations + 2.0 * weights
    return activations + weights


def _measured_s(node: OpNode, profile: Profile, *, precision: str, batch_fraction: float, shard: int) -> float | None:
    """A measured op_table time for a linear of this shape, if the profile has one."""
    table = profile.device.op_table
    if not table or node.op != "linear" or not node.output_shape:
        return None
    k, n = node.attrs.get("in_features"), node.attrs.get("out_features")
    if not k or not n:
        return None
    rows = 1
    for dim in node.output_shape[:-1]:
        rows *= dim
    m = int(round(rows * batch_fraction))
    dtype = peak_dtype(profile, precision)
    keys = {f"m={m},n={n // shard},k={k}", f"m={m},n={n},k={k // shard}"}
    for row in table:
        if row.op in ("linear", "matmul") and row.dtype == dtype and row.shape in keys:
            return row.time_s
    return None
