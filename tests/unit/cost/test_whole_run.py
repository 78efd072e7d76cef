"""Whole-run time and cost (cost/run/whole_run.py) on known answers: steps, wall time, device-hours,
dollars, whole instances billed, goodput from cost/run/reliability.py, spot with interruptions."""

from __future__ import annotations

from dataclasses import replace

import pytest

from autoplan.cost.run import reliability
from autoplan.cost.run.whole_run import RunPricer, check_prices, priced_profile, run_length, violation
from autoplan.display import hours_text, usd_text
from autoplan.errors import PlanError
from autoplan.types.prediction import Prediction
from autoplan.types.run import RunEstimate, RunSpec
from tests.synthetic.profiles import rental_profile, synthetic_profile

PARAMS = 1.0e9


def _pricer(spec: RunSpec, profile, *, batch=32, seq=1024) -> RunPricer:
    return RunPricer(spec, profile=profile, params=PARAMS, batch_size=batch, seq_len=seq)


def test_steps_wall_time_device_hours_and_dollars_without_failure_data():
    profile = rental_profile(name="plain", price=2.5)  # no storage/reliability: goodput 1, said so
    estimate = _pricer(RunSpec(tokens=1e9), profile).estimate(step_time_s=2.0, devices=16)
    assert estimate.tokens_per_step == 32 * 1024
    assert estimate.steps == 30518  # ceil(1e9 / 32768) = ceil(30517.58)
    assert estimate.tokens == 30518 * 32768
    assert estimate.ideal_wall_h == pytest.approx(30518 * 2.0 / 3600)
    assert estimate.goodput == 1.0 and "no storage or reliability section" in estimate.goodput_note
    assert estimate.expected_wall_h == estimate.ideal_wall_h
    assert estimate.device_hours == pytest.approx(16 * 30518 * 2.0 / 3600)
    assert estimate.cost_usd == pytest.approx(2.5 * 16 * 30518 * 2.0 / 3600)
    assert estimate.spot_cost_usd is None and estimate.dollars == estimate.cost_usd


def test_steps_given_directly_and_whole_instances_billed():
    profile = rental_profile(name="plain", price=3.0)
    estimate = _pricer(RunSpec(steps=1000), profile).estimate(step_time_s=3.6, devices=12)
    assert estimate.steps == 1000 and estimate.ideal_wall_h == pytest.approx(1.0)
    assert estimate.billed_devices == 16  # two 8-device instances
    assert estimate.device_hours == pytest.approx(12.0)
    assert estimate.cost_usd == pytest.approx(16 * 3.0)


def test_tokens_need_a_sequence_length():
    with pytest.raises(PlanError, match="--steps N"):
        run_length(RunSpec(tokens=1e9), batch_size=8, seq_len=None)
    assert run_length(RunSpec(steps=7), batch_size=8, seq_len=None) == (7, None)


def test_failures_lower_goodput_as_cost_reliability_prices_it():
    profile = rental_profile(name="failing", price=2.0, failures_per_device_hour=1e-4)
    estimate = _pricer(RunSpec(steps=10_000), profile).estimate(step_time_s=5.0, devices=256)
    expected = reliability.expected_goodput(params=PARAMS, devices=256, profile=profile).expected_goodput
    assert estimate.goodput == pytest.approx(expected) and 0.5 < expected < 1.0
    assert estimate.goodput_note == ""
    assert estimate.expected_wall_h == pytest.approx(estimate.ideal_wall_h / expected)
    assert estimate.job_mtbf_h == pytest.approx(1 / (1e-4 * 256))
    assert estimate.cost_usd == pytest.approx(256 * 2.0 * estimate.ideal_wall_h / expected)


def test_spot_interruptions_are_failures_lowering_goodput_and_raising_cost_per_useful_hour():
    rate, spot_rate = 1e-4, 5e-4
    profile = rental_profile(
        name="spotty", price=4.0, spot_price=1.5, spot_interruptions=spot_rate, failures_per_device_hour=rate
    )
    estimate = _pricer(RunSpec(steps=10_000, spot=True), profile).estimate(step_time_s=5.0, devices=256)
    # Daly's goodput with M = 3600 / ((lambda + lambda_spot) N), from reliability's own primitives
    size = reliability.checkpoint_bytes(params=PARAMS)
    write_s, read_s = reliability.checkpoint_times_s(checkpoint_bytes=size, devices=256, profile=profile)
    mtbf_s = 3600 / ((rate + spot_rate) * 256)
    tau = reliability.daly_interval_s(blocking_s=write_s, mtbf_s=mtbf_s)
    expected = reliability.goodput(interval_s=tau, blocking_s=write_s, restart_s=600.0 + read_s, mtbf_s=mtbf_s)
    assert estimate.spot_goodput == pytest.approx(expected)
    assert estimate.spot_goodput < estimate.goodput
    assert estimate.spot_wall_h == pytest.approx(estimate.ideal_wall_h / expected)
    assert estimate.spot_wall_h > estimate.expected_wall_h
    assert estimate.spot_cost_usd == pytest.approx(256 * 1.5 * estimate.spot_wall_h)
    assert estimate.spot_cost_usd / estimate.ideal_wall_h > 256 * 1.5  # lost work costs more per useful hour
    assert estimate.spot and estimate.dollars == estimate.spot_cost_usd and estimate.wall_h == estimate.spot_wall_h


def test_spot_without_interruptions_costs_the_spot_price_times_the_on_demand_time():
    profile = rental_profile(
        name="calm", price=4.0, spot_price=1.0, spot_interruptions=0.0, failures_per_device_hour=1e-5
    )
    estimate = _pricer(RunSpec(steps=100, spot=True), profile).estimate(step_time_s=36.0, devices=8)
    assert estimate.spot_goodput == pytest.approx(estimate.goodput)
    assert estimate.spot_cost_usd == pytest.approx(estimate.cost_usd / 4.0)


def test_deadline_and_budget_violations_say_by_how_much():
    profile = rental_profile(name="plain", price=2.0)
    spec = RunSpec(steps=3600, deadline_h=1.5, budget_usd=20.0)
    fine = _pricer(spec, profile).estimate(step_time_s=1.0, devices=8)  # 1 h, $16
    assert violation(fine) == ""
    slow = _pricer(spec, profile).estimate(step_time_s=2.0, devices=8)  # 2 h, $32
    assert violation(slow) == "misses the deadline: 2 h > 1.5 h; over budget: $32.00 > $20.00"


@pytest.mark.parametrize(
    "kwargs, words",
    [
        ({"tokens": 1e9, "steps": 10}, "pass only one"),
        ({"tokens": 1e9, "price_per_device_hour": -1.0}, "--price-per-device-hour -1.0"),
        ({"tokens": 1e9, "price_per_device_hour": 0}, "positive number of dollars"),
        ({"deadline_h": 72.0}, "--deadline needs the whole run's length"),
        ({"budget_usd": 10.0}, "--budget needs"),
        ({"spot": True}, "--spot needs"),
        ({"steps": 0}, "--steps 0"),
    ],
)
def test_bad_run_specs_fail_in_one_sentence(kwargs, words):
    with pytest.raises(PlanError, match=words):
        RunSpec(**kwargs)


def test_missing_prices_name_the_flag_or_the_profile_field():
    bare = replace(synthetic_profile(name="bare"), pricing=None)
    with pytest.raises(PlanError, match="--objective cost needs a price.*--price-per-device-hour"):
        check_prices(bare, RunSpec(tokens=1e9), objective="cost")
    with pytest.raises(PlanError, match="--budget needs a price"):
        check_prices(bare, RunSpec(tokens=1e9, budget_usd=5.0))
    check_prices(
        priced_profile(bare, RunSpec(tokens=1e9, price_per_device_hour=2.0)), RunSpec(tokens=1e9), objective="cost"
    )
    on_demand_only = rental_profile(name="od", price=2.0, failures_per_device_hour=1e-5)
    with pytest.raises(PlanError, match="--spot-price-per-device-hour"):
        check_prices(on_demand_only, RunSpec(tokens=1e9, spot=True))
    spec = RunSpec(tokens=1e9, spot=True, spot_price_per_device_hour=1.0)
    with pytest.raises(PlanError, match="--spot-interruptions-per-device-hour"):
        check_prices(priced_profile(on_demand_only, spec), spec)
    no_failures = rental_profile(name="nf", price=2.0, spot_price=1.0, spot_interruptions=1e-4)
    with pytest.raises(PlanError, match="storage or reliability section"):
        check_prices(no_failures, RunSpec(tokens=1e9, spot=True))


def test_price_overrides_fold_into_the_profile_pricing():
    profile = rental_profile(name="p", price=2.0)
    spec = RunSpec(
        tokens=1e9, price_per_device_hour=3.0, spot_price_per_device_hour=1.0, spot_interruptions_per_device_hour=1e-4
    )
    priced = priced_profile(profile, spec)
    assert priced.price_per_device_hour == 3.0 and priced.pricing.spot_per_device_hour == 1.0
    assert priced.pricing.spot_interruptions_per_device_hour == 1e-4
    assert priced.pricing.instance == profile.pricing.instance and profile.price_per_device_hour == 2.0
    assert priced_profile(profile, RunSpec(tokens=1e9)) is profile


def test_the_estimate_round_trips_through_plan_json():
    profile = rental_profile(
        name="spotty", price=4.0, spot_price=1.5, spot_interruptions=5e-4, failures_per_device_hour=1e-4
    )
    estimate = _pricer(RunSpec(tokens=1e10, spot=True, deadline_h=100.0), profile).estimate(step_time_s=1.0, devices=64)
    assert RunEstimate.from_dict(estimate.to_dict()) == estimate
    prediction = Prediction(step_time_s=1.0, run=estimate)
    data = prediction.to_dict()
    assert data["run"]["spot_cost_usd"] == estimate.spot_cost_usd
    assert Prediction.from_dict(data) == prediction
    assert "run" not in Prediction(step_time_s=1.0).to_dict()
    with pytest.raises(PlanError, match="predicted.run has no 'steps'"):
        RunEstimate.from_dict({k: v for k, v in estimate.to_dict().items() if k != "steps"})


def test_durations_and_dollars_read_as_people_write_them():
    assert hours_text(0.5) == "30 min" and hours_text(14.2) == "14.2 h" and hours_text(74.4) == "3.1 days"
    assert usd_text(52_312.0) == "$52,300" and usd_text(12.4) == "$12.40" and usd_text(1_234_567) == "$1,230,000"
