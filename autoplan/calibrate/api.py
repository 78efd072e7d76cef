"""``calibrate(run_dirs, profile=...)``: measured run folders -> a calibrated profile.

Reads the run folders (runs.py), refits the profile (fit.py) and records what it was fitted
from (record.py). See docs/calibration.md for the formulation and how to calibrate a cluster.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from autoplan.calibrate.fit import FitOptions, FitResult, fit_profile
from autoplan.calibrate.record import record
from autoplan.calibrate.runs import Observation, load_observations
from autoplan.types.profile import Profile


@dataclass
class Calibration:
    profile: Profile  # calibrated, with its calibration field written
    fit: FitResult
    observations: list[Observation]


def calibrate(
    run_dirs: list[str | os.PathLike], *, profile: Profile | str, options: FitOptions | None = None
) -> Calibration:
    """Refit ``profile``'s efficiency and link numbers to the measured runs in ``run_dirs``."""
    from autoplan.profile import load_profile

    origin = profile.name if isinstance(profile, Profile) else str(profile)
    original = load_profile(profile)
    observations = load_observations(list(run_dirs), profile=original)
    return calibrate_observations(observations, profile=original, origin=origin, options=options)


def calibrate_observations(
    observations: list[Observation], *, profile: Profile, origin: str = "", options: FitOptions | None = None
) -> Calibration:
    """The same from observations already in memory (tests, benchmarks that trace once)."""
    result = fit_profile(profile, observations, options)
    calibrated = record(result, observations, original=profile, origin=origin or profile.name)
    return Calibration(profile=calibrated, fit=result, observations=observations)
