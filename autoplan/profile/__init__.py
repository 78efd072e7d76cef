"""Hardware profiles: load and save them (io), fit them (fit), measure this machine (measure).

``load_profile`` and ``save_profile`` never import torch.distributed; ``measure_profile``
imports the measurement package only when called.
"""

from __future__ import annotations

from typing import Any

from autoplan.profile.io import available_profiles, load_profile, save_profile

__all__ = ["load_profile", "save_profile", "measure_profile", "available_profiles"]


def measure_profile(**kwargs: Any):
    """Measure this machine; see :func:`autoplan.profile.measure.measure_profile`."""
    from autoplan.profile.measure import measure_profile as measure

    return measure(**kwargs)
