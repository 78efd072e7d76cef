"""Calibration: refit a profile's efficiency and link numbers from measured runs (docs/calibration.md).

The names below are imported lazily, so ``autoplan.cli.calibrate`` (and with it every
``autoplan`` command) starts without scipy.
"""

from __future__ import annotations

import importlib
from typing import Any

_API = {
    "calibrate": "autoplan.calibrate.api",
    "calibrate_observations": "autoplan.calibrate.api",
    "Calibration": "autoplan.calibrate.api",
    "FitOptions": "autoplan.calibrate.fit",
    "fit_profile": "autoplan.calibrate.fit",
    "CalibrationError": "autoplan.calibrate.runs",
    "Observation": "autoplan.calibrate.runs",
}

__all__ = [
    "calibrate",
    "calibrate_observations",
    "Calibration",
    "FitOptions",
    "fit_profile",
    "CalibrationError",
    "Observation",
]


def __getattr__(name: str) -> Any:
    if name not in _API:
        raise AttributeError(f"module 'autoplan.calibrate' has no attribute '{name}'")
    return getattr(importlib.import_module(_API[name]), name)
