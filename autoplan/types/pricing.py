"""What a profile's devices cost to rent: ``Profile.pricing`` (optional; docs/profile-format.md).

Prices change, so each carries its date and source. ``on_demand_per_device_hour`` is what
``--objective cost`` and the whole-run report use; ``spot_per_device_hour`` with
``spot_interruptions_per_device_hour`` (an interruption reclaims the device: the job stops as on a
failure, autoplan/cost/run/reliability.py) prices a spot run's expected cost including lost work.
``instance`` names the rental (``p5.48xlarge``), ``devices_per_instance`` how many devices one
holds (the unit a cloud bills and a cluster grows by).

The older flat fields ``price_per_device_hour`` and ``price_source`` of a profile still load: they
become ``pricing`` with ``as_of`` unknown.
"""

from __future__ import annotations

import datetime
import re
from dataclasses import dataclass
from typing import Any

from autoplan.errors import ProfileError
from autoplan.types._check import require

DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")


def _price(name: str, value: Any, *, optional: bool = False) -> None:
    if optional and value is None:
        return
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0
    require(ok, ProfileError, f"profile field 'pricing.{name}' is {value!r}; expected a positive number of dollars.")


@dataclass
class PricingSpec:
    """Dollars per device-hour, with the date and source of each price (module docstring)."""

    on_demand_per_device_hour: float
    source: str
    as_of: str = "unknown"  # YYYY-MM-DD the price was read
    instance: str = ""
    devices_per_instance: int | None = None
    region: str = ""
    spot_per_device_hour: float | None = None
    spot_source: str | None = None
    spot_interruptions_per_device_hour: float | None = None
    spot_interruption_source: str | None = None

    def __post_init__(self) -> None:
        if isinstance(self.as_of, datetime.date):  # YAML reads 2026-01-21 as a date
            self.as_of = self.as_of.isoformat()

    def check(self) -> None:
        _price("on_demand_per_device_hour", self.on_demand_per_device_hour)
        _price("spot_per_device_hour", self.spot_per_device_hour, optional=True)
        require(
            isinstance(self.source, str) and self.source.strip() != "",
            ProfileError,
            f"profile field 'pricing.source' is {self.source!r}; expected where the price comes from.",
        )
        require(
            self.as_of == "unknown" or bool(DATE.match(str(self.as_of))),
            ProfileError,
            f"profile field 'pricing.as_of' is {self.as_of!r}; expected the date the price was read, YYYY-MM-DD.",
        )
        if self.spot_per_device_hour is not None:
            require(
                bool(self.spot_source),
                ProfileError,
                "profile field 'pricing.spot_source' is missing; a spot price needs its source.",
            )
        rate = self.spot_interruptions_per_device_hour
        if rate is not None:
            require(
                isinstance(rate, (int, float)) and not isinstance(rate, bool) and rate >= 0,
                ProfileError,
                f"profile field 'pricing.spot_interruptions_per_device_hour' is {rate!r}; expected a number >= 0.",
            )
            require(
                bool(self.spot_interruption_source),
                ProfileError,
                "profile field 'pricing.spot_interruption_source' is missing; an interruption rate needs its source.",
            )
        count = self.devices_per_instance
        require(
            count is None or (isinstance(count, int) and count >= 1),
            ProfileError,
            f"profile field 'pricing.devices_per_instance' is {count!r}; expected an integer >= 1.",
        )

    def per_device_hour(self, *, spot: bool = False) -> float:
        """The price a run pays per device-hour: on-demand, or spot (ProfileError when there is none)."""
        if not spot:
            return self.on_demand_per_device_hour
        if self.spot_per_device_hour is None:
            raise ProfileError(
                f"profile pricing for '{self.instance or 'this device'}' has no spot price; add "
                "pricing.spot_per_device_hour with its source, or price on-demand."
            )
        return self.spot_per_device_hour


def pricing_from(data: dict[str, Any]) -> PricingSpec | None:
    """``pricing`` of a profile mapping: its section, else the old flat fields, else None."""
    if isinstance(data.get("pricing"), dict):
        return PricingSpec(**data["pricing"])
    if data.get("price_per_device_hour") is not None:
        return PricingSpec(
            on_demand_per_device_hour=data["price_per_device_hour"],
            source=data.get("price_source") or "unknown (the profile's price_per_device_hour)",
        )
    return None
