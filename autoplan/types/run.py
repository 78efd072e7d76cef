"""A whole training run, asked and answered: :class:`RunSpec` (what the user wants: its length,
prices, spot, a deadline and a budget) and :class:`RunEstimate` (what it takes: steps, wall time,
device-hours and dollars, on-demand and on spot). cost/run/whole_run.py turns one into the other;
``Prediction.run`` (types/prediction.py) records the estimate in plan.json (docs/plan-format.md).

Units are in names: ``_h`` hours, ``_s`` seconds, ``_usd`` dollars, ``_per_device_hour`` per
device and hour. Both check themselves when built and raise one sentence naming the flag to change.
"""

from __future__ import annotations

import math
from dataclasses import MISSING, asdict, dataclass, fields
from typing import Any

from autoplan.errors import PlanError
from autoplan.types._check import require, require_known_fields


def _positive(flag: str, value: Any, unit: str) -> None:
    if value is None:
        return
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0
    require(ok, PlanError, f"{flag} {value!r} is not valid; expected a positive number of {unit}.")


@dataclass(frozen=True)
class RunSpec:
    """The run to price: ``tokens`` or ``steps`` (not both), price overrides, spot, constraints."""

    tokens: float | None = None
    steps: int | None = None
    spot: bool = False
    price_per_device_hour: float | None = None  # overrides the profile's on-demand price
    spot_price_per_device_hour: float | None = None  # overrides the profile's spot price
    spot_interruptions_per_device_hour: float | None = None  # overrides the profile's rate
    deadline_h: float | None = None
    budget_usd: float | None = None

    def __post_init__(self) -> None:
        require(
            self.tokens is None or self.steps is None,
            PlanError,
            "--tokens and --steps both give the run's length; pass only one.",
        )
        _positive("--tokens", self.tokens, "tokens")
        steps = self.steps
        require(
            steps is None or (isinstance(steps, int) and not isinstance(steps, bool) and steps >= 1),
            PlanError,
            f"--steps {steps!r} is not valid; expected a whole number of optimizer steps >= 1.",
        )
        _positive("--price-per-device-hour", self.price_per_device_hour, "dollars per device-hour")
        _positive("--spot-price-per-device-hour", self.spot_price_per_device_hour, "dollars per device-hour")
        rate = self.spot_interruptions_per_device_hour
        require(
            rate is None or (isinstance(rate, (int, float)) and not isinstance(rate, bool) and rate >= 0),
            PlanError,
            f"--spot-interruptions-per-device-hour {rate!r} is not valid; expected a number >= 0.",
        )
        _positive("--deadline", self.deadline_h, "hours")
        _positive("--budget", self.budget_usd, "dollars")
        for flag, given in (("--deadline", self.deadline_h), ("--budget", self.budget_usd), ("--spot", self.spot)):
            require(
                not given or self.has_length,
                PlanError,
                f"{flag} needs the whole run's length: pass --tokens N or --steps N.",
            )

    @property
    def has_length(self) -> bool:
        return self.tokens is not None or self.steps is not None

    @property
    def constrained(self) -> bool:
        return self.deadline_h is not None or self.budget_usd is not None


@dataclass
class RunEstimate:
    """A whole run on one plan and cluster (cost/run/whole_run.py gives the formulas).

    ``expected_wall_h`` = ``ideal_wall_h`` / ``goodput``; ``device_hours`` = devices x
    expected_wall_h; ``cost_usd`` = billed_devices x expected_wall_h x price. The ``spot_*``
    fields are the same run on spot devices, where every interruption is one more failure
    (None unless asked for). ``goodput_note`` says why goodput is 1 when it is not priced."""

    steps: int
    step_time_s: float
    devices: int
    billed_devices: int
    samples_per_step: int
    ideal_wall_h: float
    goodput: float
    expected_wall_h: float
    device_hours: float
    tokens: float | None = None
    tokens_per_step: float | None = None
    goodput_note: str = ""
    job_mtbf_h: float | None = None
    checkpoint_interval_s: float | None = None
    price_per_device_hour: float | None = None
    price_as_of: str | None = None
    cost_usd: float | None = None
    spot_price_per_device_hour: float | None = None
    spot_interruptions_per_device_hour: float | None = None
    spot_goodput: float | None = None
    spot_wall_h: float | None = None
    spot_device_hours: float | None = None
    spot_cost_usd: float | None = None
    deadline_h: float | None = None
    budget_usd: float | None = None

    def __post_init__(self) -> None:
        for name in ("goodput", "spot_goodput"):
            value = getattr(self, name)
            require(
                value is None or (isinstance(value, (int, float)) and 0.0 < value <= 1.0),
                PlanError,
                f"plan predicted.run.{name}={value!r}; expected a fraction in (0, 1].",
            )
        require(
            isinstance(self.steps, int) and self.steps >= 1,
            PlanError,
            f"plan predicted.run.steps={self.steps!r}; expected an integer >= 1.",
        )

    @property
    def spot(self) -> bool:
        return self.spot_cost_usd is not None

    @property
    def wall_h(self) -> float:
        """The run's expected wall time: on spot when priced on spot, else on-demand."""
        return self.spot_wall_h if self.spot else self.expected_wall_h

    @property
    def dollars(self) -> float | None:
        """The run's expected dollars: on spot when priced on spot, else on-demand (None: no price)."""
        return self.spot_cost_usd if self.spot else self.cost_usd

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "RunEstimate":
        require(isinstance(data, dict), PlanError, f"plan predicted.run is {data!r:.60}; expected a mapping.")
        require_known_fields(data, cls, PlanError, "plan predicted.run")
        missing = [f.name for f in fields(cls) if f.default is MISSING and f.name not in data]
        require(not missing, PlanError, f"plan predicted.run has no '{missing[0] if missing else ''}'.")
        return cls(**data)
