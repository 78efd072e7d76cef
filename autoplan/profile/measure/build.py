"""Turn raw measurements into a Profile: fit the efficiency curves and the alpha-busbw lines.

Peaks of a measured device: there is no datasheet for "this machine with T threads", so
``peak_flops[dtype]`` is the best saturated rate measured in that dtype (the largest
1/slope of t(F) over the op classes, see fit.saturated_rate). Efficiencies are then
fractions of that peak: per dtype in ``efficiency_by_dtype``, and one joint curve per op
class (all dtypes, time scaled by each dtype's peak) in ``efficiency``. Matmul rows (a
linear's forward GEMM and both backward GEMMs) and attention rows time forward + backward
(compute.kernel_calls = 2): the curve is fitted so that the cost model's forward (F/3) plus
backward (2F/3) prediction, each paying the half-saturation term once, equals the measured
time (fit.fit_efficiency); a grouped-GEMM row of E experts stands for 3E expert GEMMs, each
paying it (cost/moe/experts.py), and fp8 rows (scaled matmuls) give the fp8 peak and curve.
The host dispatch overhead per op (overhead.py) goes to
``device.op_overhead`` (``op_overhead``).
"""

from __future__ import annotations

import platform
from collections import defaultdict
from datetime import datetime, timezone

import torch

from autoplan.profile.fit import fit_collective, fit_efficiency, saturated_rate
from autoplan.profile.measure.compute import kernel_calls
from autoplan.profile.measure.overhead import describe as describe_overhead
from autoplan.types.profile import OP_CLASSES, CollectiveFit, DeviceSpec, Efficiency, LinkSpec, OpOverhead, OpTiming
from autoplan.version import __version__


def measured_source(what: str) -> str:
    """'measured on <host> at <date> with autoplan X / torch Y (<what>)'."""
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    return f"measured on {platform.node()} at {stamp} with autoplan {__version__} / torch {torch.__version__} ({what})"


def _by(rows: list[OpTiming], *keys: str) -> dict[tuple, list[OpTiming]]:
    groups: dict[tuple, list[OpTiming]] = defaultdict(list)
    for row in rows:
        groups[tuple(getattr(row, key) for key in keys)].append(row)
    return groups


def peaks(rows: list[OpTiming]) -> dict[str, float]:
    """Per dtype: the best saturated rate over op classes (and never below a measured rate)."""
    best: dict[str, float] = {}
    for (dtype, _), group in _by(rows, "dtype", "op").items():
        calls = [kernel_calls(r.op, r.shape) for r in group]
        rate = saturated_rate(flops=[r.flops for r in group], time_s=[r.time_s for r in group], calls=calls)
        achieved = max(r.flops / r.time_s for r in group)
        best[dtype] = max(best.get(dtype, 0.0), rate, achieved)
    return best


def _curve(group: list[OpTiming], peak: dict[str, float], source: str) -> Efficiency:
    a, half = fit_efficiency(
        flops=[r.flops for r in group],
        time_s=[r.time_s for r in group],
        peak_flops=[peak[r.dtype] for r in group],
        calls=[kernel_calls(r.op, r.shape) for r in group],
    )
    return Efficiency(max_efficiency=min(1.0, a), half_saturation_flops=half, source=source)


def efficiencies(
    rows: list[OpTiming], peak: dict[str, float], source: str
) -> tuple[dict[str, Efficiency], dict[str, dict[str, Efficiency]]]:
    """(joint curve per op class, per-dtype curves per op class)."""
    joint = {op: _curve(group, peak, source) for (op,), group in _by(rows, "op").items()}
    per_dtype: dict[str, dict[str, Efficiency]] = defaultdict(dict)
    for (dtype, op), group in _by(rows, "dtype", "op").items():
        per_dtype[dtype][op] = _curve(group, peak, source)
    return joint, dict(per_dtype)


def op_overhead(*, forward_s: float, backward_s: float, how: str) -> OpOverhead:
    """The measured host overhead per op; ``how``: who timed it (e.g. all N processes at once)."""
    return OpOverhead(
        forward_s=forward_s, backward_s=backward_s, source=measured_source(f"{describe_overhead()}; {how}")
    )


def device_spec(
    *,
    name: str,
    memory_bytes: int,
    rows: list[OpTiming],
    copy_bandwidth: float,
    memory_efficiency: float,
    threads: int,
    how: str | None = None,
    overhead: OpOverhead | None = None,
) -> DeviceSpec:
    """``how``: how the compute was timed (e.g. all N processes at once), recorded in ``source``;
    ``overhead``: the measured ``op_overhead`` (None: not measured)."""
    sweep = [row for row in rows if row.op in OP_CLASSES]  # model-op rows (--model) stay in the table only
    peak = peaks(sweep)
    timed = how or f"{threads} threads"
    source = measured_source(
        f"compute sweep and memory kernels timed with {timed}; matmul as a linear's forward + 2 backward "
        f"GEMMs, attention forward + backward, causal (at the half executed) and full; grouped GEMMs "
        f"forward + 2 backward per expert; least-squares fit of t = (F + calls * F_half)/(a*peak)"
    )
    joint, per_dtype = efficiencies(sweep, peak, source)
    return DeviceSpec(
        name=name,
        memory_bytes=memory_bytes,
        peak_flops=peak,
        memory_bandwidth_bytes_per_s=copy_bandwidth,
        efficiency=joint,
        efficiency_by_dtype=per_dtype,
        source=source,
        memory_efficiency=memory_efficiency,
        op_table=rows,
        op_overhead=overhead,
    )


def link_spec(*, name: str, points: dict[str, list[list[float]]], backend: str) -> LinkSpec:
    source = measured_source(f"{backend} collectives, robust fit of t = alpha + c(n)*S/busbw")
    fits = {}
    for kind, rows in points.items():
        alpha_s, busbw = fit_collective(kind=kind, points=rows)
        fits[kind] = CollectiveFit(alpha_s=alpha_s, busbw_bytes_per_s=busbw, source=source, points=rows)
    return LinkSpec(name=name, collectives=fits)
