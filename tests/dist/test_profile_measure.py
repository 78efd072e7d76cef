"""A real two-process gloo profiling run (small sweep) yields a valid, monotone profile with the
host overhead per op, and ``autoplan profile --refresh op_overhead`` re-measures only that. A one-device
profile with --links-from is checked on the one that benchmarks/gpu_check.sh measures
(tests/dist/test_gpu_check_cpu.py), which runs that command first."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from autoplan.cli.profile import run as profile_cli
from autoplan.profile import load_profile, measure_profile, save_profile
from autoplan.profile.fit import predict_collective_s
from autoplan.profile.measure import CommSweep
from autoplan.profile.measure.compute import QUICK_SWEEP
from autoplan.types.profile import COLLECTIVES


@pytest.mark.slow
def test_two_process_gloo_profile(tmp_path: Path) -> None:
    sweep = CommSweep(max_bytes=2**20, factor=4)
    profile = measure_profile(
        devices=2, name="t", compute_sweep=QUICK_SWEEP, comm_sweep=sweep, progress=False, timeout_s=120
    )
    assert profile.backend == "gloo" and profile.devices_per_node == 2 and profile.threads >= 1
    assert profile.device.memory_bandwidth_bytes_per_s > 0 and set(profile.device.peak_flops) == {"fp32", "bf16"}
    assert {row.op for row in profile.device.op_table} == {"matmul", "attention", "conv", "grouped_matmul"}
    assert {"attention", "grouped_matmul"} <= set(profile.device.efficiency)  # curves the cost model reads
    masks = {row.shape.split(",")[4] for row in profile.device.op_table if row.op == "attention"}
    assert masks == {"causal", "full"}
    assert all(row.shape.endswith("fwd+bwd") for row in profile.device.op_table if row.op in ("attention", "matmul"))
    overhead = profile.device.op_overhead
    assert overhead is not None and overhead.forward_s > 0 and overhead.backward_s > 0
    assert "chain length" in overhead.source and "all 2 processes" in overhead.source
    assert "all 2 processes computing at once" in profile.device.source and "at once" in profile.description
    for kind in COLLECTIVES:
        fit = profile.intra_node.collectives[kind]
        assert fit.busbw_bytes_per_s > 0 and fit.alpha_s >= 0
        assert [int(p[1]) for p in fit.points] == sweep.sizes() and all(p[2] > 0 for p in fit.points)
        group = int(fit.points[0][0])
        times = [
            predict_collective_s(
                kind=kind,
                group_size=group,
                message_bytes=size,
                alpha_s=fit.alpha_s,
                busbw_bytes_per_s=fit.busbw_bytes_per_s,
            )
            for size in sweep.sizes()
        ]
        assert all(a < b for a, b in zip(times, times[1:]))
    path = save_profile(profile, tmp_path / "t.yaml")
    assert load_profile(path).to_dict() == profile.to_dict()
    _refresh_overhead(path, before=profile)


def _refresh_overhead(path: Path, *, before) -> None:
    args = argparse.Namespace(
        show=None,
        out=str(path),
        refresh="op_overhead",
        devices=2,
        threads=None,
        batch=1,
        links_from=None,
        timeout=120.0,
        quiet=True,
        json=False,
    )
    assert profile_cli(args) == 0
    after = load_profile(path)
    assert (
        after.device.op_overhead.forward_s > 0 and after.device.op_overhead.source != before.device.op_overhead.source
    )
    assert after.device.op_table == before.device.op_table and after.intra_node == before.intra_node
