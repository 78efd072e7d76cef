"""Fit the profile's models to measured (or published) points. Pure numpy/scipy, no torch.

Both models are affine in time, so one robust fit serves both:

* Collectives (nccl-tests bus-bandwidth convention, nccl-tests PERFORMANCE.md; Thakur,
  Rabenseifner & Gropp 2005):  t(n, S) = alpha_s + c(n) * S / busbw_bytes_per_s with
  c(n) = autoplan.types.profile.bus_factor. Fit t against x = c(n)*S: intercept = alpha_s, slope = 1/busbw.
* Compute efficiency  eff(F) = a*F/(F + F_half)  with t = F / (peak * eff(F)) gives
  t * peak = F/a + F_half/a, affine in F: slope = 1/a, intercept = F_half/a. A point that
  times ``calls`` kernel calls together (attention forward + backward: 2) of total FLOPs F is
  predicted by the cost model as the sum over the calls, t * peak = F/a + calls * F_half/a,
  so F_half = intercept * a / calls.

The fit minimises soft-L1 *relative* residuals ((model - t)/t), because the points span
five or more decades of time and a few noisy points must not drag the line
(scipy.optimize.least_squares, loss="soft_l1"). Both coefficients are kept >= 0 and the
slope > 0, so every fitted time increases strictly with size.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from scipy.optimize import least_squares

from autoplan.errors import ProfileError
from autoplan.types.profile import bus_factor

#: Relative noise scale at which soft-L1 starts to down-weight a residual.
RELATIVE_NOISE_SCALE = 0.05


def fit_affine(*, x: Sequence[float], t: Sequence[float]) -> tuple[float, float]:
    """Robust fit of t = intercept + slope * x with intercept >= 0 and slope > 0."""
    x_arr, t_arr = np.asarray(x, dtype=float), np.asarray(t, dtype=float)
    if len(x_arr) < 2 or np.any(t_arr <= 0) or np.any(x_arr < 0):
        raise ProfileError(
            f"cannot fit a line to {len(x_arr)} points with non-positive times; expected >= 2 points with times > 0."
        )
    scale_x, scale_t = float(x_arr.max()), float(t_arr.max())
    xs, ts = x_arr / scale_x, t_arr / scale_t
    start = _start(xs, ts)

    def residuals(p: np.ndarray) -> np.ndarray:
        return (p[0] + p[1] * xs - ts) / ts

    result = least_squares(
        residuals, start, bounds=([0.0, 1e-12], [np.inf, np.inf]), loss="soft_l1", f_scale=RELATIVE_NOISE_SCALE
    )
    intercept, slope = result.x
    return float(intercept * scale_t), float(slope * scale_t / scale_x)


def _start(xs: np.ndarray, ts: np.ndarray) -> np.ndarray:
    """A starting point from weighted linear least squares (weights 1/t), clipped to the bounds."""
    design = np.stack([np.ones_like(xs), xs], axis=1) / ts[:, None]
    coef, *_ = np.linalg.lstsq(design, np.ones_like(ts), rcond=None)
    return np.array([max(coef[0], 0.0), max(coef[1], 1e-6)])


def fit_collective(*, kind: str, points: Sequence[Sequence[float]]) -> tuple[float, float]:
    """(alpha_s, busbw_bytes_per_s) from [group_size, message_bytes, time_s] rows."""
    x = [bus_factor(kind=kind, group_size=int(n)) * size for n, size, _ in points]
    alpha_s, slope = fit_affine(x=x, t=[row[2] for row in points])
    return alpha_s, 1.0 / slope


def fit_efficiency(
    *, flops: Sequence[float], time_s: Sequence[float], peak_flops: Sequence[float], calls: int | Sequence[int] = 1
) -> tuple[float, float]:
    """(max_efficiency, half_saturation_flops) of eff(F) = a*F/(F+F_half).

    ``peak_flops`` is the peak for each point's dtype, so points of several dtypes share one
    curve after scaling time by their peak (t * peak is the time in "peak FLOPs"). ``calls``:
    kernel calls per timed point (one number, or one per point), each paying the per-call overhead
    F_half/(a*peak). Dividing t * peak = F/a + c*F_half/a by c leaves a line in the FLOPs per call,
    F/c, with intercept F_half/a, so points of different call counts (grouped GEMMs of E experts:
    3E) share one fit; the relative residuals are unchanged by the division.
    """
    counts = [calls] * len(flops) if isinstance(calls, int) else list(calls)
    per_call = [f / c for f, c in zip(flops, counts)]
    scaled = [t * p / c for t, p, c in zip(time_s, peak_flops, counts)]
    intercept, slope = fit_affine(x=per_call, t=scaled)
    return 1.0 / slope, intercept / slope


#: The sweep reached the saturated regime when its largest call spends at most this fraction of its
#: time in the fitted fixed cost (the intercept); past it, 1/slope extrapolates beyond anything timed.
SATURATED_INTERCEPT_FRACTION = 0.1


def saturated_rate(*, flops: Sequence[float], time_s: Sequence[float], calls: int | Sequence[int] = 1) -> float:
    """The large-size throughput (FLOP/s) of one op class in one dtype: 1/slope of t(F) = t0 + F/rate,
    fitted per kernel call (t/c against F/c, as fit_efficiency does, so that grouped GEMMs of
    different expert counts share one line).

    Trusted only when the sweep saturated (its largest call's time t_max has t0 <= 0.1 * t_max,
    SATURATED_INTERCEPT_FRACTION): a sweep of launch-bound calls (small shapes on a GPU) gives a
    slope near zero, and 1/slope a rate no call achieved. Then the best achieved rate max F/t is
    the answer: a lower bound that the sweep measured."""
    counts = [calls] * len(flops) if isinstance(calls, int) else list(calls)
    per_call = [f / c for f, c in zip(flops, counts)]
    per_call_s = [t / c for t, c in zip(time_s, counts)]
    intercept, slope = fit_affine(x=per_call, t=per_call_s)
    achieved = max(f / t for f, t in zip(flops, time_s))
    largest_s = max(t for f, t in zip(per_call, per_call_s) if f == max(per_call))
    if intercept > SATURATED_INTERCEPT_FRACTION * largest_s:
        return achieved
    return 1.0 / slope


def predict_collective_s(
    *, kind: str, group_size: int, message_bytes: float, alpha_s: float, busbw_bytes_per_s: float
) -> float:
    """t(n, S) = alpha + c(n) S / busbw."""
    return alpha_s + bus_factor(kind=kind, group_size=group_size) * message_bytes / busbw_bytes_per_s


def predict_op_s(*, flops: float, peak_flops: float, max_efficiency: float, half_saturation_flops: float) -> float:
    """t = F / (peak * a*F/(F+F_half)) = (F + F_half) / (a * peak)."""
    return (flops + half_saturation_flops) / (max_efficiency * peak_flops)
