"""Where a profile's checkpoints go and how often its devices fail: ``Profile.storage`` and
``Profile.reliability`` (both optional; docs/profile-format.md).

``StorageSpec`` gives the bandwidth each device gets to write and read checkpoints, and an
optional cap for the whole cluster (a storage system has a fixed throughput however many
devices write to it). ``ReliabilitySpec`` gives the failure rate per device-hour (every
interruption that kills a synchronous job, whatever part of the node caused it, divided by
the devices that ran it) and the time to detect a failure, restart the job and re-initialise
it, not counting the checkpoint read, which the storage prices. autoplan/cost/run/reliability.py
turns both into a checkpoint interval and an expected goodput.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from autoplan.errors import ProfileError
from autoplan.types._check import require


def _number(owner: str, name: str, value: Any, *, zero_ok: bool = False) -> None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and (value >= 0 if zero_ok else value > 0)
    expected = "a number >= 0" if zero_ok else "a positive number"
    require(ok, ProfileError, f"profile field '{owner}.{name}' is {value!r}; expected {expected}.")


def _text(owner: str, name: str, value: Any) -> None:
    require(
        isinstance(value, str) and value.strip() != "",
        ProfileError,
        f"profile field '{owner}.{name}' is {value!r}; expected a non-empty string naming where the numbers come from.",
    )


@dataclass
class StorageSpec:
    """Checkpoint storage, bytes per second: each device's share of the write and read bandwidth,
    an optional cap on the whole cluster's, and the device-to-host copy an asynchronous save
    blocks on (optional)."""

    write_bytes_per_s_per_device: float
    read_bytes_per_s_per_device: float
    source: str
    max_total_bytes_per_s: float | None = None
    staging_bytes_per_s_per_device: float | None = None

    def check(self) -> None:
        _number("storage", "write_bytes_per_s_per_device", self.write_bytes_per_s_per_device)
        _number("storage", "read_bytes_per_s_per_device", self.read_bytes_per_s_per_device)
        for name in ("max_total_bytes_per_s", "staging_bytes_per_s_per_device"):
            if getattr(self, name) is not None:
                _number("storage", name, getattr(self, name))
        _text("storage", "source", self.source)

    def write_bytes_per_s(self, devices: int) -> float:
        """The cluster's write bandwidth: min(devices x per-device, cap)."""
        return self._total(devices * self.write_bytes_per_s_per_device)

    def read_bytes_per_s(self, devices: int) -> float:
        """The cluster's read bandwidth: min(devices x per-device, cap)."""
        return self._total(devices * self.read_bytes_per_s_per_device)

    def _total(self, bandwidth: float) -> float:
        return bandwidth if self.max_total_bytes_per_s is None else min(bandwidth, self.max_total_bytes_per_s)


@dataclass
class ReliabilitySpec:
    """Failures per device-hour (module docstring) and seconds to detect, restart and re-initialise a job."""

    failures_per_device_hour: float
    restart_s: float
    source: str
    restart_source: str

    def check(self) -> None:
        _number("reliability", "failures_per_device_hour", self.failures_per_device_hour)
        _number("reliability", "restart_s", self.restart_s, zero_ok=True)
        _text("reliability", "source", self.source)
        _text("reliability", "restart_source", self.restart_source)

    def job_mtbf_s(self, devices: int) -> float:
        """Mean time between failures of a job on ``devices`` devices, M = 3600 / (lambda N)
        seconds: any device's failure stops a synchronous job, failures independent."""
        return 3600.0 / (self.failures_per_device_hour * devices)


def check_section(value: Any, kind: type, name: str) -> None:
    """A profile's optional section: None, or a ``kind`` that checks itself."""
    if value is None:
        return
    require(
        isinstance(value, kind),
        ProfileError,
        f"profile field '{name}' is {value!r:.60}; expected a mapping (see docs/profile-format.md).",
    )
    value.check()
