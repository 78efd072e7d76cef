"""Cost model: predict step time, memory and throughput of a plan on a profiled cluster.

Graph + Profile + Plan -> Cost, as plain functions with no process group; docs/architecture.md
draws the subpackages and docs/cost-model.md states every formula with its source. What the
planner may ask is :mod:`autoplan.cost.api`, re-exported here: solve/ imports cost/ only so.
"""

from autoplan.cost.api import *  # noqa: F403
from autoplan.cost.api import __all__ as _api
from autoplan.cost.model import estimate

__all__ = [*_api, "estimate"]
