"""Checkpoints, failures and goodput: how much of a job's wall time trains (docs/cost-model.md,
"Checkpoints, failures and goodput").

Symbols: P parameters, C checkpoint bytes, N devices, lambda failures per device-hour, M the
job's mean time between failures (s), W and W_r the time to write and read one checkpoint,
delta the time a checkpoint blocks training, R the time from a failure until training runs
again (the profile's ``restart_s`` plus W_r), tau the training time between checkpoints.

    C = 12 P                                 fp32 weights + AdamW exp_avg + exp_avg_sq (memory.model_states)
    W = C / min(N w, cap),  W_r likewise     w: the profile's per-device bandwidth (types/reliability.py)
    M = 3600 / (lambda N)                    any device's failure stops a synchronous job
    tau_Young = sqrt(2 delta M)              Young 1974, CACM 17(9)
    tau_Daly  = sqrt(2 delta M) [1 + (1/3) sqrt(delta/2M) + (1/9) (delta/2M)] - delta   (delta < 2M; else M)
    goodput   = tau / (M e^(R/M) (e^((tau + delta)/M) - 1))                            Daly 2006, FGCS 22(3)

An asynchronous save blocks for delta = (bytes a device holds) / ``staging_bytes_per_s_per_device``
and adds W to R.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from autoplan.cost.memory.per_device import model_states
from autoplan.display import number_text
from autoplan.errors import ProfileError
from autoplan.types.profile import Profile


def checkpoint_bytes(*, params: float) -> float:
    """C: fp32 weights and AdamW moments of ``params`` parameters, the model states the
    executor keeps with one replica and no autocast copy (which is not saved): 12 bytes each."""
    states = model_states(params=params, precision="fp32", zero_stage=0, dp=1)
    return states.weights_bytes + states.optimizer_bytes


def checkpoint_times_s(*, checkpoint_bytes: float, devices: int, profile: Profile) -> tuple[float, float]:
    """(W, W_r): seconds to write and to read a checkpoint of ``checkpoint_bytes`` from all devices."""
    storage = profile.storage
    if storage is None:
        raise ProfileError(f"profile '{profile.name}' has no storage section; add one (docs/profile-format.md).")
    return checkpoint_bytes / storage.write_bytes_per_s(devices), checkpoint_bytes / storage.read_bytes_per_s(devices)


def young_interval_s(*, blocking_s: float, mtbf_s: float) -> float:
    """Young's first-order optimum, tau = sqrt(2 delta M)."""
    return math.sqrt(2.0 * blocking_s * mtbf_s)


def daly_interval_s(*, blocking_s: float, mtbf_s: float) -> float:
    """Daly's higher-order optimum (module docstring); M when a checkpoint takes 2M or more."""
    if blocking_s >= 2.0 * mtbf_s:
        return mtbf_s
    xi = blocking_s / (2.0 * mtbf_s)
    return young_interval_s(blocking_s=blocking_s, mtbf_s=mtbf_s) * (1 + math.sqrt(xi) / 3 + xi / 9) - blocking_s


def goodput(*, interval_s: float, blocking_s: float, restart_s: float, mtbf_s: float) -> float:
    """T_s / T_w of Daly's model (module docstring): the fraction of wall time that trains."""
    if math.isinf(mtbf_s):
        return interval_s / (interval_s + blocking_s)
    wall = mtbf_s * math.exp(restart_s / mtbf_s) * math.expm1((interval_s + blocking_s) / mtbf_s)
    return interval_s / wall


@dataclass(frozen=True)
class Goodput:
    """A job's checkpoints and failures on one cluster (module docstring); seconds and bytes."""

    devices: int
    checkpoint_bytes: float
    checkpoint_write_s: float
    checkpoint_read_s: float
    blocking_s: float
    restart_s: float  # R: the profile's restart_s + the read (+ W when asynchronous)
    job_mtbf_s: float
    young_interval_s: float
    checkpoint_interval_s: float
    checkpoint_every_steps: int | None
    expected_goodput: float
    async_save: bool = False

    @property
    def lost_fraction(self) -> float:
        return 1.0 - self.expected_goodput

    def prediction_fields(self) -> dict:
        """The fields ``Prediction`` records (types/prediction.py)."""
        return {
            "checkpoint_bytes": self.checkpoint_bytes,
            "checkpoint_write_s": self.checkpoint_write_s,
            "checkpoint_read_s": self.checkpoint_read_s,
            "checkpoint_interval_s": self.checkpoint_interval_s,
            "checkpoint_every_steps": self.checkpoint_every_steps,
            "job_mtbf_s": self.job_mtbf_s,
            "expected_goodput": self.expected_goodput,
        }


def expected_goodput(
    *,
    params: float,
    devices: int,
    profile: Profile,
    step_time_s: float | None = None,
    interval_s: float | None = None,
    async_save: bool = False,
    held_bytes: float | None = None,
    spot_interruptions_per_device_hour: float = 0.0,
) -> Goodput:
    """Checkpoint interval and goodput of a ``params``-parameter model on ``devices`` devices.

    The interval is Daly's unless ``interval_s`` is given; with ``step_time_s`` it is rounded to
    whole steps (at least one), the executor's ``--checkpoint-every``, and goodput is priced at
    the rounded interval. ``async_save`` prices ``--async-checkpoint``; ``held_bytes`` is what one
    device stages (default C / N, fully sharded states). On spot devices each interruption is
    one more failure: M = 3600 / ((lambda + lambda_spot) N). Raises ProfileError without the
    profile's storage and reliability sections (:func:`not_priced_reason`)."""
    if (reason := not_priced_reason(profile)) is not None:
        raise ProfileError(reason)
    size = checkpoint_bytes(params=params)
    write_s, read_s = checkpoint_times_s(checkpoint_bytes=size, devices=devices, profile=profile)
    mtbf_s = profile.reliability.job_mtbf_s(devices)
    if spot_interruptions_per_device_hour:
        rate = profile.reliability.failures_per_device_hour + spot_interruptions_per_device_hour
        mtbf_s = 3600.0 / (rate * devices)
    restart_s = profile.reliability.restart_s + read_s
    blocking_s, floor_s = write_s, 0.0
    if async_save:
        blocking_s = _staging_s(profile, held_bytes if held_bytes is not None else size / devices)
        restart_s, floor_s = restart_s + write_s, max(0.0, write_s - blocking_s)
    tau = interval_s if interval_s is not None else max(floor_s, daly_interval_s(blocking_s=blocking_s, mtbf_s=mtbf_s))
    steps = None
    if step_time_s:
        steps = max(1, round(tau / step_time_s))
        tau = steps * step_time_s
    return Goodput(
        devices=devices,
        checkpoint_bytes=size,
        checkpoint_write_s=write_s,
        checkpoint_read_s=read_s,
        blocking_s=blocking_s,
        restart_s=restart_s,
        job_mtbf_s=mtbf_s,
        young_interval_s=young_interval_s(blocking_s=blocking_s, mtbf_s=mtbf_s),
        checkpoint_interval_s=tau,
        checkpoint_every_steps=steps,
        expected_goodput=goodput(interval_s=tau, blocking_s=blocking_s, restart_s=restart_s, mtbf_s=mtbf_s),
        async_save=async_save,
    )


def _staging_s(profile: Profile, held_bytes: float) -> float:
    rate = profile.storage.staging_bytes_per_s_per_device
    if rate is None:
        raise ProfileError(
            f"profile '{profile.name}' has no storage.staging_bytes_per_s_per_device, "
            "so an asynchronous checkpoint's blocking time cannot be priced; add the device-to-host copy rate."
        )
    return held_bytes / rate


def not_priced_reason(profile: Profile) -> str | None:
    """One sentence saying why checkpoints and goodput are not priced on ``profile``, or None."""
    missing = [name for name in ("storage", "reliability") if getattr(profile, name) is None]
    if not missing:
        return None
    return (
        f"checkpoint interval and goodput not priced: profile '{profile.name}' has no "
        f"{' or '.join(missing)} section (docs/profile-format.md)."
    )


def prediction_fields(*, params: float, devices: int, profile: Profile, step_time_s: float) -> dict:
    """The planner's Prediction fields for a synchronous save every Daly interval; {} when the
    profile cannot price them."""
    if not_priced_reason(profile) is not None:
        return {}
    return expected_goodput(
        params=params, devices=devices, profile=profile, step_time_s=step_time_s
    ).prediction_fields()


def summary(fields: dict) -> str:
    """One line for the console and explain: the interval, the write, the job's MTBF and goodput."""
    steps, interval = fields.get("checkpoint_every_steps"), _duration(fields["checkpoint_interval_s"])
    every = f"every {steps} steps ({interval}, Daly)" if steps else f"every {interval} (Daly)"
    return (
        f"checkpoint {every}, {_size(fields['checkpoint_bytes'])} written in "
        f"{_duration(fields['checkpoint_write_s'])}; job MTBF {_duration(fields['job_mtbf_s'])}; "
        f"expected goodput {100 * fields['expected_goodput']:.2f}%"
    )


def _size(nbytes: float) -> str:
    return f"{nbytes / 1e12:.3g} TB" if nbytes >= 1e12 else f"{nbytes / 1e9:.3g} GB"


def _duration(seconds: float) -> str:
    """Hours, minutes or seconds, three significant figures and no exponent (autoplan/display.py)."""
    if seconds >= 3600:
        return f"{number_text(seconds / 3600)} h"
    if seconds >= 60:
        return f"{number_text(seconds / 60)} min"
    return f"{number_text(seconds)} s"
