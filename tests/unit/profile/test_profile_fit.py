"""The fits recover known parameters from synthetic points, robustly, and stay monotone."""

from __future__ import annotations

import numpy as np
import pytest

from autoplan.errors import ProfileError
from autoplan.profile.fit import (
    fit_affine,
    fit_collective,
    fit_efficiency,
    predict_collective_s,
    predict_op_s,
    saturated_rate,
)
from autoplan.types.profile import DeviceSpec, Efficiency, bus_factor


def test_bus_factors_follow_nccl_tests() -> None:
    assert bus_factor(kind="all_reduce", group_size=8) == pytest.approx(1.75)
    assert bus_factor(kind="all_gather", group_size=4) == pytest.approx(0.75)
    assert bus_factor(kind="send_recv", group_size=2) == 1.0
    with pytest.raises(ProfileError):
        bus_factor(kind="broadcast", group_size=2)


def test_a_group_of_one_rank_sends_nothing_and_an_empty_group_is_refused() -> None:
    """One definition for the fitter and the cost model: c = 0 at n = 1 for every collective
    (send_recv is point to point: 1), and a group of no ranks is a bad input, not a division by zero."""
    collectives = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")
    assert [bus_factor(kind=kind, group_size=1) for kind in collectives] == [0.0] * 4
    assert bus_factor(kind="send_recv", group_size=1) == 1.0
    with pytest.raises(ProfileError, match="group of 0 ranks"):
        bus_factor(kind="all_reduce", group_size=0)


def test_collective_fit_recovers_alpha_and_busbw_despite_an_outlier() -> None:
    rng = np.random.default_rng(0)
    sizes = np.geomspace(1024, 2**28, 19)
    points = [
        [
            4,
            s,
            predict_collective_s(kind="all_gather", group_size=4, message_bytes=s, alpha_s=20e-6, busbw_bytes_per_s=5e9)
            * (1 + 0.02 * rng.standard_normal()),
        ]
        for s in sizes
    ]
    points[10][2] *= 5  # one straggler
    alpha_s, busbw = fit_collective(kind="all_gather", points=points)
    assert alpha_s == pytest.approx(20e-6, rel=0.15)
    assert busbw == pytest.approx(5e9, rel=0.05)


def test_efficiency_fit_recovers_curve_across_dtypes() -> None:
    flops = np.geomspace(1e5, 1e10, 12)
    peaks = {"fp32": 1e11, "bf16": 8e11}
    rows = [
        (f, predict_op_s(flops=f, peak_flops=p, max_efficiency=0.7, half_saturation_flops=3e7), p)
        for p in peaks.values()
        for f in flops
    ]
    a, half = fit_efficiency(flops=[r[0] for r in rows], time_s=[r[1] for r in rows], peak_flops=[r[2] for r in rows])
    assert a == pytest.approx(0.7, rel=1e-3) and half == pytest.approx(3e7, rel=1e-2)


def test_fit_is_monotone_even_for_decreasing_times() -> None:
    intercept, slope = fit_affine(x=[1, 2, 3, 4], t=[4.0, 3.0, 2.0, 1.0])
    assert intercept >= 0 and slope > 0


def test_fit_rejects_bad_points() -> None:
    with pytest.raises(ProfileError):
        fit_affine(x=[1.0], t=[1.0])
    with pytest.raises(ProfileError):
        fit_affine(x=[1.0, 2.0], t=[0.0, 1.0])


def test_efficiency_for_prefers_per_dtype_curve() -> None:
    base = Efficiency(max_efficiency=0.5, half_saturation_flops=1.0, source="s")
    bf16 = Efficiency(max_efficiency=0.9, half_saturation_flops=1.0, source="s")
    spec = DeviceSpec(
        name="d",
        memory_bytes=1,
        peak_flops={"fp32": 1.0, "bf16": 2.0},
        memory_bandwidth_bytes_per_s=1.0,
        efficiency={"matmul": base},
        efficiency_by_dtype={"bf16": {"matmul": bf16}},
        source="s",
    )
    assert spec.efficiency_for("matmul", "bf16") is bf16
    assert spec.efficiency_for("matmul", "fp32") is base
    assert spec.efficiency_for("conv", "fp32") is base


def test_saturated_rate_is_the_slope_only_where_the_sweep_saturated() -> None:
    """A sweep into the saturated regime gives 1/slope; one of launch-bound calls (a CPU sweep on a
    GPU: 10 us of launch, 1 PFLOP/s) gives the best achieved rate, never a rate no call reached."""
    flops = np.geomspace(1e6, 1e13, 15)
    saturated = 10e-6 + flops / 1e15
    assert saturated_rate(flops=flops, time_s=saturated) == pytest.approx(1e15, rel=0.02)
    launch_bound = flops[:6]
    times = 10e-6 + launch_bound / 1e15
    rate = saturated_rate(flops=launch_bound, time_s=times)
    assert rate == pytest.approx(max(launch_bound / times)) and rate < 1e15
