"""Write what a calibration was fitted from into the calibrated profile.

The profile's ``calibration`` field gets: the date, the autoplan and torch versions, the profile
it started from, the method and its options, every run (folder, plan, model file, measured and
predicted step time before and after), every refitted number (before, after) and the numbers left
as they were; the median and largest absolute percentage error before and after. Each refitted
group's ``source`` says it was calibrated, when, and from how many runs.
"""

from __future__ import annotations

import socket
import statistics
from datetime import datetime, timezone
from typing import Any

from autoplan.calibrate.fit import FitResult, abs_pct_errors
from autoplan.calibrate.params import get_value, owner_of
from autoplan.calibrate.runs import Observation
from autoplan.types.profile import Profile

METHOD = (
    "scipy.optimize.least_squares (trf, bounded) on ln(predicted / measured) step time, Gaussian prior on "
    "ln(value / original) (docs/calibration.md)"
)


def _versions() -> dict[str, str]:
    import torch

    from autoplan.version import __version__

    return {"autoplan": str(__version__), "torch": str(torch.__version__)}


def error_summary(predicted_s: list[float], measured_s: list[float]) -> dict[str, float]:
    errors = abs_pct_errors(predicted_s, measured_s)
    return {"median_abs_pct": statistics.median(errors), "max_abs_pct": max(errors)}


def record(result: FitResult, observations: list[Observation], *, original: Profile, origin: str) -> Profile:
    """``result.profile`` with its ``calibration`` field and the refitted sources filled in."""
    profile = result.profile
    now = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    versions = _versions()
    note = (
        f"calibrated on {socket.gethostname()} at {now} with autoplan {versions['autoplan']} "
        f"from {len(observations)} measured runs "
        f"(autoplan calibrate; see calibration)"
    )
    for owner in sorted({owner_of(p.path) for p in result.fitted}):
        _set_source(profile, owner, note)
    profile.calibration = {
        "date": now,
        "host": socket.gethostname(),
        "versions": versions,
        "from_profile": origin,
        "method": METHOD,
        "options": {
            "noise_sigma": result.options.noise_sigma,
            "prior_sigma": result.options.prior_sigma,
            "min_sensitivity": result.options.min_sensitivity,
        },
        "converged": result.converged,
        "message": result.message,
        "runs": [_run_row(obs, j, result) for j, obs in enumerate(observations)],
        "parameters": {
            p.path: {"before": get_value(original, p.path), "after": v}
            for p, v in zip(result.fitted, result.values_after)
        },
        "unchanged": result.unused,
        "error_before": error_summary(result.predicted_before_s, result.measured_s),
        "error_after": error_summary(result.predicted_after_s, result.measured_s),
        "previous": original.calibration or None,
    }
    return profile


def _run_row(obs: Observation, j: int, result: FitResult) -> dict[str, Any]:
    return {
        "folder": obs.label,
        "plan": obs.plan.describe(),
        "model_file": obs.model_file,
        "environment": obs.environment,
        "noise_sigma": obs.noise_sigma,
        "measured_step_time_s": result.measured_s[j],
        "predicted_before_s": result.predicted_before_s[j],
        "predicted_after_s": result.predicted_after_s[j],
    }


def _set_source(profile: Profile, owner: str, note: str) -> None:
    parts = owner.split(".")
    if parts == ["comm_overlap"]:
        profile.comm_overlap.source = note
    elif parts == ["device"]:  # only memory_efficiency: the peaks keep their own provenance
        profile.device.source = (
            f"{profile.device.source.split('; memory_efficiency calibrated')[0]}; memory_efficiency {note}"
        )
    elif parts[:2] == ["device", "op_overhead"]:
        profile.device.op_overhead.source = note
    elif parts[0] == "device":
        profile.device.efficiency_by_dtype[parts[2]][parts[3]].source = note
    else:
        getattr(profile, parts[0]).collectives[parts[2]].source = note
