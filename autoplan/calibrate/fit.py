"""The refit: move a profile's efficiency and link numbers so the cost model matches measured runs
(docs/calibration.md, "The fit": the weights, the prior, the two starts and why).

For runs j (graph, plan, measured median step time m_j) and the refittable numbers p_i of
autoplan/calibrate/params.py, written as log multipliers theta_i = ln(p_i / p_i^0), solve

    min_theta  sum_j ( ln T_j(theta) - ln m_j )^2 / s_j^2   +   sum_i theta_i^2 / s_p^2
    subject to |theta_i| <= ln 20,  max_efficiency <= 1

where T_j(theta) = CostModel(graph_j, profile(theta)).estimate(plan_j).step_time_s,
s_j = max(``noise_sigma``, the run's own noise: runs.median_noise_sigma) and s_p the prior's width
(a Gaussian prior centred on the original profile: a MAP estimate, Bishop 2006 section 3.3). Only
parameters that change some run's prediction by at least ``min_sensitivity`` when doubled are
fitted. Solved with scipy.optimize.least_squares (trust-region reflective, bounded; Branch, Coleman
& Li 1999) from two starts, the original profile and the best uniform log factor per group of
throughput numbers, keeping the lower objective.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field

import numpy as np
from scipy.optimize import least_squares

from autoplan.calibrate.params import Parameter, apply, candidate_parameters
from autoplan.calibrate.runs import CalibrationError, Observation
from autoplan.cost import CostModel
from autoplan.types.profile import Profile


@dataclass
class FitOptions:
    noise_sigma: float = 0.05  # s_m: log std of a measured median step time
    prior_sigma: float = 1.0  # s_p: log std of the prior on each number (1.0 = a factor e)
    min_sensitivity: float = 1e-3  # fit a number only if doubling it moves some prediction by this (log)
    max_evaluations: int = 400


@dataclass
class FitResult:
    profile: Profile  # the calibrated profile (calibration field not yet written)
    fitted: list[Parameter]
    values_after: list[float]
    unused: list[str]  # candidate numbers the runs carry no information about
    labels: list[str]
    measured_s: list[float]
    predicted_before_s: list[float]
    predicted_after_s: list[float]
    converged: bool
    message: str
    options: FitOptions = field(default_factory=FitOptions)


#: Every profile priced during a fit stays referenced until the fit ends: the TP cost terms are
#: cached on the graph under id(profile) (autoplan/cost/tp/splits.py), so a profile freed
#: and another allocated at the same address would silently reuse the old one's terms.
_PRICED: list[Profile] = []


def predict_s(profile: Profile, observations: list[Observation]) -> np.ndarray:
    """Predicted step time of every observation on ``profile`` (one CostModel per distinct graph)."""
    _PRICED.append(profile)
    models: dict[int, CostModel] = {}
    out = np.empty(len(observations))
    for j, obs in enumerate(observations):
        model = models.get(id(obs.graph))
        if model is None:
            model = models[id(obs.graph)] = CostModel(obs.graph, profile)
        out[j] = model.estimate(obs.plan).step_time_s
    return out


def _lean(profile: Profile) -> Profile:
    """A copy without the raw collective points, which predictions never read (faster copies)."""
    lean = copy.deepcopy(profile)
    for link in (lean.intra_node, lean.inter_node):
        for fit in link.collectives.values() if link is not None else ():
            fit.points = []
    return lean


def informative(
    profile: Profile, params: list[Parameter], observations: list[Observation], *, min_sensitivity: float
) -> list[bool]:
    """For each parameter: does doubling it (halving a capped max_efficiency) move any prediction?"""
    base = np.log(predict_s(profile, observations))
    flags = []
    for param in params:
        factor = 2.0 if param.original * 2.0 <= param.upper else 0.5
        moved = np.log(predict_s(apply(profile, [param], [param.original * factor]), observations))
        flags.append(bool(np.max(np.abs(moved - base)) >= min_sensitivity))
    return flags


def fit_profile(profile: Profile, observations: list[Observation], options: FitOptions | None = None) -> FitResult:
    """Refit ``profile`` to ``observations`` (module docstring)."""
    try:
        return _fit(profile, observations, options or FitOptions())
    finally:
        _PRICED.clear()


def _fit(profile: Profile, observations: list[Observation], options: FitOptions) -> FitResult:
    _check(observations)
    lean = _lean(profile)
    precisions = {obs.plan.precision for obs in observations}
    candidates = candidate_parameters(lean, precisions=precisions)
    flags = informative(lean, candidates, observations, min_sensitivity=options.min_sensitivity)
    fitted = [p for p, used in zip(candidates, flags) if used]
    measured = np.array([obs.measured_step_time_s for obs in observations])
    before = predict_s(lean, observations)
    theta, converged, message = _solve(lean, fitted, observations, np.log(measured), options)
    values = [p.original * math.exp(t) for p, t in zip(fitted, theta)]
    after = predict_s(apply(lean, fitted, values), observations)
    return FitResult(
        profile=apply(profile, fitted, values),
        fitted=fitted,
        values_after=values,
        unused=[p.path for p, used in zip(candidates, flags) if not used],
        labels=[obs.label or f"run {j}" for j, obs in enumerate(observations)],
        measured_s=measured.tolist(),
        predicted_before_s=before.tolist(),
        predicted_after_s=after.tolist(),
        converged=converged,
        message=message,
        options=options,
    )


def _solve(
    lean: Profile,
    fitted: list[Parameter],
    observations: list[Observation],
    log_measured: np.ndarray,
    options: FitOptions,
) -> tuple[np.ndarray, bool, str]:
    """Two starts, keep the better: the original profile, and a uniform compute / link scale (module doc)."""
    if not fitted:
        return np.zeros(0), True, "no parameter of the profile changes any run's prediction"
    sigma = np.array([max(options.noise_sigma, obs.noise_sigma or 0.0) for obs in observations])

    def residuals(theta: np.ndarray) -> np.ndarray:
        values = [p.original * math.exp(t) for p, t in zip(fitted, theta)]
        predicted = predict_s(apply(lean, fitted, values), observations)
        return np.concatenate([(np.log(predicted) - log_measured) / sigma, theta / options.prior_sigma])

    low, high = (np.array(b) for b in zip(*(p.theta_bounds for p in fitted)))
    best = None
    for x0 in (np.zeros(len(fitted)), _group_start(fitted, residuals, low, high)):
        result = least_squares(
            residuals,
            np.clip(x0, low, high),
            bounds=(low, high),
            method="trf",
            diff_step=1e-3,
            x_scale="jac",
            ftol=1e-10,
            xtol=1e-10,
            gtol=1e-10,
            max_nfev=options.max_evaluations,
        )
        if best is None or result.cost < best.cost:
            best = result
    return best.x, bool(best.success), str(best.message)


def group_of(param: Parameter) -> str | None:
    """Throughput numbers that a uniformly slower (or faster) machine would scale together."""
    name = param.path.rsplit(".", 1)[-1]
    if name in ("max_efficiency", "memory_efficiency"):
        return "compute"
    return "link" if name == "busbw_bytes_per_s" else None


def _group_start(fitted: list[Parameter], residuals, low: np.ndarray, high: np.ndarray) -> np.ndarray:
    """The best common log factor per group (compute, link), other numbers as they are: the usual gap between
    micro-benchmarks and a real run is one throughput factor (contention, framework overhead), and starting
    from it keeps the piecewise roofline from trading compute for memory time on the way."""
    groups = sorted({g for g in map(group_of, fitted) if g})
    if not groups:
        return np.zeros(len(fitted))
    members = np.array([[1.0 if group_of(p) == g else 0.0 for g in groups] for p in fitted])
    g_low = np.array([max(low[members[:, k] > 0]) for k in range(len(groups))])
    g_high = np.array([min(high[members[:, k] > 0]) for k in range(len(groups))])
    result = least_squares(
        lambda phi: residuals(members @ phi),
        np.clip(np.zeros(len(groups)), g_low, g_high),
        bounds=(g_low, np.maximum(g_high, g_low + 1e-9)),
        method="trf",
        diff_step=1e-3,
    )
    return members @ result.x


def _check(observations: list[Observation]) -> None:
    if not observations:
        raise CalibrationError("no measured runs to calibrate from; pass one or more run folders.")
    for obs in observations:
        if not obs.measured_step_time_s > 0:
            raise CalibrationError(
                f"run '{obs.label}' has measured step time {obs.measured_step_time_s!r}; "
                "expected a positive number of seconds."
            )


def abs_pct_errors(predicted_s: list[float], measured_s: list[float]) -> list[float]:
    """|predicted - measured| / measured * 100, per run."""
    return [abs(p - m) / m * 100.0 for p, m in zip(predicted_s, measured_s)]
