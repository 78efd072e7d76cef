"""The profile numbers a calibration may refit, and how a candidate value is written into a profile.

Each parameter is one positive number of the profile, addressed by a dotted path:

- ``device.efficiency_by_dtype.<dtype>.<matmul|attention>.max_efficiency`` and
  ``...half_saturation_flops``: the saturating efficiency curve ``eff(F) = a F / (F + F_half)``
  (docs/profile-format.md) of that op class in the dtype the runs computed in. When the profile
  only has a shared ``device.efficiency`` curve, the refit writes a per-dtype copy, so a bf16
  refit never moves fp32 predictions;
- ``device.memory_efficiency``: the achieved fraction of memory bandwidth (memory-bound ops, Adam);
- ``<intra_node|inter_node>.collectives.<kind>.alpha_s`` and ``...busbw_bytes_per_s``: the
  alpha-beta fit ``t = alpha_s + c(n) S / busbw`` of one collective on one link;
- ``device.op_overhead.forward_s`` and ``...backward_s``: host dispatch time per op (when the
  profile has it), which dominates runs with small micro-batches;
- ``comm_overlap.efficiency``: the fraction of a collective's time that hides under concurrent
  compute (kept <= 1); runs with overlapped gradient sync (DDP, ZeRO-3 prefetch) inform it.

The fit works on log multipliers ``theta = ln(value / original)``, so every parameter stays
positive and has the same scale; ``max_efficiency`` is also kept <= 1. Peaks are never refitted:
``peak * max_efficiency`` is all the cost model sees, so fitting both would not be identifiable.
A parameter whose original value is 0 (e.g. ``half_saturation_flops = 0``) cannot be scaled and
is left as it is.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

from autoplan.cost import peak_dtype
from autoplan.types.profile import COLLECTIVES, Efficiency, Profile

#: Op classes with an efficiency curve (a curve no run exercises is left alone, see fit.informative).
CURVE_CLASSES = ("matmul", "attention", "conv")
CURVE_FIELDS = ("max_efficiency", "half_saturation_flops")
LINK_FIELDS = ("alpha_s", "busbw_bytes_per_s")
OVERLAP_PATH = "comm_overlap.efficiency"
OVERHEAD_FIELDS = ("forward_s", "backward_s")
#: Largest factor a refit may move a number by, either way (a wider move means the model, not the number, is wrong).
MAX_FACTOR = 20.0


@dataclass(frozen=True)
class Parameter:
    path: str  # dotted path, e.g. "intra_node.collectives.all_reduce.busbw_bytes_per_s"
    original: float
    upper: float  # largest allowed value (max_efficiency <= 1)

    @property
    def theta_bounds(self) -> tuple[float, float]:
        low = -math.log(MAX_FACTOR)
        high = min(math.log(MAX_FACTOR), math.log(self.upper / self.original))
        return low, max(high, low + 1e-9)


def candidate_parameters(profile: Profile, *, precisions: set[str]) -> list[Parameter]:
    """Every refittable number of ``profile`` that plans in ``precisions`` can depend on."""
    params = [Parameter("device.memory_efficiency", profile.device.memory_efficiency, math.inf)]
    if profile.device.op_overhead is not None:
        params += [
            Parameter(f"device.op_overhead.{f}", getattr(profile.device.op_overhead, f), math.inf)
            for f in OVERHEAD_FIELDS
        ]
    for dtype in sorted({peak_dtype(profile, p) for p in precisions}):
        for op_class in CURVE_CLASSES:
            curve = _effective_curve(profile, dtype, op_class)
            if curve is None:
                continue
            base = f"device.efficiency_by_dtype.{dtype}.{op_class}"
            params.append(Parameter(f"{base}.max_efficiency", curve.max_efficiency, 1.0))
            params.append(Parameter(f"{base}.half_saturation_flops", curve.half_saturation_flops, math.inf))
    for link_name in ("intra_node", "inter_node"):
        link = getattr(profile, link_name)
        if link is None:
            continue
        for kind in COLLECTIVES:
            fit = link.collectives[kind]
            params += [Parameter(f"{link_name}.collectives.{kind}.{f}", getattr(fit, f), math.inf) for f in LINK_FIELDS]
    params.append(Parameter(OVERLAP_PATH, profile.comm_overlap.efficiency, 1.0))
    return [p for p in params if p.original > 0]


def _effective_curve(profile: Profile, dtype: str, op_class: str) -> Efficiency | None:
    """The curve the cost model uses for ``op_class`` in ``dtype``, or None when it falls back to matmul's."""
    device = profile.device
    return device.efficiency_by_dtype.get(dtype, {}).get(op_class) or device.efficiency.get(op_class)


def apply(profile: Profile, params: list[Parameter], values: list[float]) -> Profile:
    """A deep copy of ``profile`` with each parameter set to its value."""
    out = copy.deepcopy(profile)
    for param, value in zip(params, values):
        set_value(out, param.path, value)
    return out


def set_value(profile: Profile, path: str, value: float) -> None:
    """Write one number at a dotted path (module docstring); per-dtype curves are created on demand."""
    parts = path.split(".")
    if path == OVERLAP_PATH:
        profile.comm_overlap.efficiency = value
    elif parts[0] == "device" and parts[1] == "memory_efficiency":
        profile.device.memory_efficiency = value
    elif parts[0] == "device" and parts[1] == "op_overhead":
        setattr(profile.device.op_overhead, parts[2], value)
    elif parts[0] == "device":
        dtype, op_class, name = parts[2], parts[3], parts[4]
        curves = profile.device.efficiency_by_dtype.setdefault(dtype, {})
        if op_class not in curves:
            curves[op_class] = copy.deepcopy(_effective_curve(profile, dtype, op_class))
        setattr(curves[op_class], name, value)
    else:
        fit = getattr(profile, parts[0]).collectives[parts[2]]
        setattr(fit, parts[3], value)


def get_value(profile: Profile, path: str) -> float:
    parts = path.split(".")
    if path == OVERLAP_PATH:
        return profile.comm_overlap.efficiency
    if parts[0] == "device" and parts[1] == "memory_efficiency":
        return profile.device.memory_efficiency
    if parts[0] == "device" and parts[1] == "op_overhead":
        return getattr(profile.device.op_overhead, parts[2])
    if parts[0] == "device":
        return getattr(_effective_curve(profile, parts[2], parts[3]), parts[4])
    return getattr(getattr(profile, parts[0]).collectives[parts[2]], parts[3])


def owner_of(path: str) -> str:
    """The dotted path of the object whose ``source`` describes this parameter."""
    parts = path.split(".")
    if path == OVERLAP_PATH:
        return "comm_overlap"
    return "device" if parts[1] == "memory_efficiency" else ".".join(parts[:-1])
