"""Whole-run time and cost: from one plan's step to the run's wall time, device-hours and
dollars, on-demand and on spot (docs/cost-model.md, "Whole-run time and cost").

Symbols: B the global batch (samples per step), S the graph's sequence length (tokens per
sample; Cost.tokens_per_s uses the same), t the predicted step time (s), N devices, n the
devices one instance holds (``pricing.devices_per_instance``; 1 when unknown), p the price per
device-hour, g the expected goodput (cost/run/reliability.py), lambda the profile's failures and
lambda_spot the spot interruptions per device-hour.

    tokens_per_step = B S
    steps           = ceil(tokens / tokens_per_step)                  (or --steps)
    T_ideal         = steps t / 3600                                  hours of training, no failures
    T               = T_ideal / g                                     g at Daly's interval, M = 3600 / (lambda N);
                                                                      g = 1 when the profile has no storage
                                                                      and reliability sections (said in goodput_note)
    device_hours    = N T
    billed          = ceil(N / n) n                                   a cloud rents whole instances
    cost_usd        = billed T p
    spot:           g' at M' = 3600 / ((lambda + lambda_spot) N)      an interruption is a failure
                    T' = T_ideal / g',  spot_cost_usd = billed T' p_spot
"""

from __future__ import annotations

import datetime
import math
from dataclasses import dataclass, replace

from autoplan.cost.run import reliability
from autoplan.display import hours_text, usd_text
from autoplan.errors import PlanError
from autoplan.types.graph import Graph
from autoplan.types.pricing import PricingSpec
from autoplan.types.profile import Profile
from autoplan.types.run import RunEstimate, RunSpec

GIVEN = "given on the command line"


def priced_profile(profile: Profile, spec: RunSpec) -> Profile:
    """``profile`` with the prices ``spec`` overrides folded into its ``pricing`` (dated today),
    so the search, the cost model and profile.json all read one price."""
    overrides = (spec.price_per_device_hour, spec.spot_price_per_device_hour, spec.spot_interruptions_per_device_hour)
    if all(value is None for value in overrides):
        return profile
    pricing = profile.pricing
    if pricing is None and spec.price_per_device_hour is None:
        raise PlanError(
            f"profile '{profile.name}' has no pricing section, so a spot price alone has nothing to compare "
            "with; pass --price-per-device-hour X too."
        )
    today = datetime.date.today().isoformat()
    base = pricing or PricingSpec(on_demand_per_device_hour=spec.price_per_device_hour, source=GIVEN, as_of=today)
    changes: dict = {}
    if spec.price_per_device_hour is not None:
        changes.update(on_demand_per_device_hour=spec.price_per_device_hour, source=GIVEN, as_of=today)
    if spec.spot_price_per_device_hour is not None:
        changes.update(spot_per_device_hour=spec.spot_price_per_device_hour, spot_source=GIVEN)
    if spec.spot_interruptions_per_device_hour is not None:
        changes.update(
            spot_interruptions_per_device_hour=spec.spot_interruptions_per_device_hour, spot_interruption_source=GIVEN
        )
    return replace(profile, pricing=replace(base, **changes))


def check_prices(profile: Profile, spec: RunSpec, *, objective: str = "time") -> None:
    """One sentence naming the flag or profile field to add when a price the run needs is missing."""
    pricing = profile.pricing
    needs = [flag for flag, on in (("--objective cost", objective == "cost"), ("--budget", spec.budget_usd)) if on]
    if needs and not spec.spot and pricing is None:
        raise PlanError(
            f"{needs[0]} needs a price, but profile '{profile.name}' has no pricing section; pass "
            "--price-per-device-hour X or add pricing.on_demand_per_device_hour (docs/profile-format.md)."
        )
    if not spec.spot:
        return
    if pricing is None or pricing.spot_per_device_hour is None:
        raise PlanError(
            f"--spot needs a spot price, but profile '{profile.name}' has no pricing.spot_per_device_hour; "
            "pass --spot-price-per-device-hour X."
        )
    if pricing.spot_interruptions_per_device_hour is None:
        raise PlanError(
            f"--spot needs how often spot devices are reclaimed, but profile '{profile.name}' has no "
            "pricing.spot_interruptions_per_device_hour; pass --spot-interruptions-per-device-hour R "
            "(e.g. 8.6e-6 for AWS's '<5% a month' band: 0.05 / 730 h / 8 devices)."
        )
    if (reason := _missing_sections(profile)) is not None:
        raise PlanError(f"--spot prices the work interruptions lose from checkpoints and restarts, but {reason}")


def run_length(spec: RunSpec, *, batch_size: int, seq_len: int | None) -> tuple[int, float | None]:
    """(steps, tokens_per_step): steps = ceil(tokens / (B S)), or ``spec.steps``."""
    tokens_per_step = float(batch_size * seq_len) if seq_len else None
    if spec.steps is not None:
        return spec.steps, tokens_per_step
    if tokens_per_step is None:
        raise PlanError(
            "--tokens needs a sequence model, but the traced graph has no sequence length; "
            "give the run's length as --steps N."
        )
    return max(1, math.ceil(spec.tokens / tokens_per_step)), tokens_per_step


@dataclass(frozen=True)
class RunGoodput:
    """Goodput on N devices (cost/run/reliability.py), or 1 with the reason it is not priced."""

    goodput: float
    note: str = ""
    job_mtbf_h: float | None = None
    checkpoint_interval_s: float | None = None


def run_goodput(profile: Profile, *, params: float, devices: int, spot_rate: float = 0.0) -> RunGoodput:
    """Expected goodput at Daly's interval (module docstring), with ``spot_rate`` interruptions
    per device-hour counted as failures."""
    if (reason := _missing_sections(profile)) is not None:
        return RunGoodput(goodput=1.0, note=f"goodput taken as 1 (no failures priced): {reason}")
    found = reliability.expected_goodput(
        params=params, devices=devices, profile=profile, spot_interruptions_per_device_hour=spot_rate
    )
    return RunGoodput(
        goodput=found.expected_goodput,
        job_mtbf_h=found.job_mtbf_s / 3600.0,
        checkpoint_interval_s=found.checkpoint_interval_s,
    )


def _missing_sections(profile: Profile) -> str | None:
    """'profile 'X' has no storage section (docs/profile-format.md).', or None when both are there."""
    reason = reliability.not_priced_reason(profile)
    return None if reason is None else reason[reason.index("profile '") :]


def dollars_per_sample(profile: Profile, *, devices: int, step_time_s: float, batch_size: int) -> float:
    """``--objective cost`` without a run length: price per device-hour x devices x step time / batch."""
    return profile.price_per_device_hour * devices * step_time_s / 3600.0 / batch_size


def billed_devices(devices: int, profile: Profile) -> int:
    """ceil(N / n) n: the devices of the whole instances a cloud rents for N."""
    per = (profile.pricing.devices_per_instance if profile.pricing else None) or 1
    return math.ceil(devices / per) * per


class RunPricer:
    """Prices whole runs of one graph on one profile (module docstring), goodput cached per N."""

    def __init__(self, spec: RunSpec, *, profile: Profile, params: float, batch_size: int, seq_len: int | None):
        self.spec, self.profile, self.params, self.batch_size = spec, profile, params, batch_size
        self.steps, self.tokens_per_step = run_length(spec, batch_size=batch_size, seq_len=seq_len)
        self._goodputs: dict[tuple[int, float], RunGoodput] = {}

    def goodput(self, devices: int, *, spot: bool = False) -> RunGoodput:
        pricing = self.profile.pricing
        rate = (pricing.spot_interruptions_per_device_hour or 0.0) if spot and pricing else 0.0
        key = (devices, rate)
        if key not in self._goodputs:
            self._goodputs[key] = run_goodput(self.profile, params=self.params, devices=devices, spot_rate=rate)
        return self._goodputs[key]

    def estimate(self, *, step_time_s: float, devices: int) -> RunEstimate:
        """The whole run at ``step_time_s`` on ``devices`` devices (module docstring)."""
        spec, pricing = self.spec, self.profile.pricing
        ideal_h = self.steps * step_time_s / 3600.0
        found = self.goodput(devices)
        wall_h = ideal_h / found.goodput
        billed = billed_devices(devices, self.profile)
        price = pricing.on_demand_per_device_hour if pricing else None
        estimate = RunEstimate(
            steps=self.steps,
            step_time_s=step_time_s,
            devices=devices,
            billed_devices=billed,
            samples_per_step=self.batch_size,
            ideal_wall_h=ideal_h,
            goodput=found.goodput,
            expected_wall_h=wall_h,
            device_hours=devices * wall_h,
            tokens=self.steps * self.tokens_per_step if self.tokens_per_step else None,
            tokens_per_step=self.tokens_per_step,
            goodput_note=found.note,
            job_mtbf_h=found.job_mtbf_h,
            checkpoint_interval_s=found.checkpoint_interval_s,
            price_per_device_hour=price,
            price_as_of=pricing.as_of if pricing else None,
            cost_usd=billed * wall_h * price if price is not None else None,
            deadline_h=spec.deadline_h,
            budget_usd=spec.budget_usd,
        )
        if spec.spot:
            spot = self.goodput(devices, spot=True)
            spot_wall_h = ideal_h / spot.goodput
            estimate.spot_price_per_device_hour = pricing.spot_per_device_hour
            estimate.spot_interruptions_per_device_hour = pricing.spot_interruptions_per_device_hour
            estimate.spot_goodput = spot.goodput
            estimate.spot_wall_h = spot_wall_h
            estimate.spot_device_hours = devices * spot_wall_h
            estimate.spot_cost_usd = billed * spot_wall_h * pricing.spot_per_device_hour
        return estimate

    def dollars(self, *, step_time_s: float, devices: int) -> float:
        """The objective ``cost`` of a whole run: expected dollars (on spot with --spot)."""
        return self.estimate(step_time_s=step_time_s, devices=devices).dollars

    def violation(self, *, step_time_s: float, devices: int) -> str:
        """Why a plan with this step time misses the deadline or the budget, or ''."""
        return violation(self.estimate(step_time_s=step_time_s, devices=devices))


def run_pricer(
    spec: RunSpec | None, *, graph: Graph, profile: Profile, batch: int, objective: str = "time"
) -> RunPricer | None:
    """The search's pricer of whole runs: None without the run's length; checks the prices first."""
    if spec is None:
        return None
    check_prices(profile, spec, objective=objective)
    if not spec.has_length:
        return None
    return RunPricer(spec, profile=profile, params=graph.param_count, batch_size=batch, seq_len=graph.seq_len)


def violation(estimate: RunEstimate) -> str:
    """'' when ``estimate`` meets its deadline and budget, else which it misses, and by how much."""
    misses = []
    if estimate.deadline_h is not None and estimate.wall_h > estimate.deadline_h:
        misses.append(f"misses the deadline: {hours_text(estimate.wall_h)} > {hours_text(estimate.deadline_h)}")
    dollars = estimate.dollars
    if estimate.budget_usd is not None and dollars is not None and dollars > estimate.budget_usd:
        misses.append(f"over budget: {usd_text(dollars)} > {usd_text(estimate.budget_usd)}")
    return "; ".join(misses)


def summary(estimate: RunEstimate) -> str:
    """One line for the console: steps, wall time, device-hours, dollars (and on spot)."""
    tokens = f" ({estimate.tokens:.3g} tokens)" if estimate.tokens else ""
    good = "" if estimate.goodput_note else f" (goodput {100 * estimate.goodput:.2f}%)"
    line = (
        f"whole run: {estimate.steps:,} steps{tokens}: {hours_text(estimate.expected_wall_h)} on {estimate.devices} "
        f"devices{good}, {estimate.device_hours:,.0f} device-hours"
    )
    if estimate.cost_usd is not None:
        line += f", {usd_text(estimate.cost_usd)} on-demand at ${estimate.price_per_device_hour:.4g}/device-h"
        line += f" (price as of {estimate.price_as_of})" if estimate.price_as_of not in (None, "unknown") else ""
    if estimate.spot:
        line += (
            f"; on spot {hours_text(estimate.spot_wall_h)} (goodput {100 * estimate.spot_goodput:.2f}% with "
            f"{estimate.spot_interruptions_per_device_hour:.3g} interruptions/device-h), "
            f"{usd_text(estimate.spot_cost_usd)} at ${estimate.spot_price_per_device_hour:.4g}/device-h"
        )
    if estimate.goodput_note:
        line += f". {estimate.goodput_note[0].upper()}{estimate.goodput_note[1:]}"
    return line + ("" if line.endswith(".") else ".")
