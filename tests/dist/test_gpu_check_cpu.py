"""benchmarks/gpu_check.sh, the script a lent GPU runs, run on this CPU (GPU_CHECK_DEVICE=cpu: quick
sweep, tiny GPTs, 2 steps): it measures a profile with the attention and grouped-GEMM curves, plans and
runs each case it can, skips the others with a reason, and writes summary.csv and curves.csv. Its first
step is a single-GPU machine's `autoplan profile --devices 1 --links-from cpu-gloo --quick`: the device
measured, the links the named profile's, each source saying so. The script runs once for the module."""

from __future__ import annotations

import csv
import os
import subprocess
from pathlib import Path

import pytest
from exec_harness import cli_here

from autoplan.profile import load_profile

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
#: the compiled case is left out here: tests/dist/test_execute.py and test_audit.py run compiled blocks on
#: gloo already, and inductor's compile is most of this script's CPU time
CASES = {"small-bf16", "small-fp8"}


@pytest.fixture(scope="module")
def checked(tmp_path_factory) -> Path:
    """The script's output folder; it ran to the end (exit 0)."""
    out = tmp_path_factory.mktemp("gpu_check")
    env = {
        **os.environ,
        "GPU_CHECK_DEVICE": "cpu",
        "PYTHONPATH": str(ROOT),
        "GPU_CHECK_BUDGET_S": "400",
        "GPU_CHECK_CASES": " ".join(sorted(CASES)),
    }
    done = subprocess.run(
        ["bash", str(ROOT / "benchmarks" / "gpu_check.sh"), str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=500,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return out


def test_gpu_check_runs_on_a_cpu_device(checked: Path) -> None:
    profile = load_profile(checked / "profile.yaml")
    assert {"matmul", "attention", "grouped_matmul"} <= set(profile.device.efficiency)
    rows = {row["case"]: row for row in csv.DictReader((checked / "summary.csv").open())}
    assert set(rows) == CASES
    row = rows["small-bf16"]
    assert row["status"] == "ok", row
    assert all(float(row[key]) > 0 for key in ("measured_step_s", "predicted_step_s", "predicted_datasheet_step_s"))
    assert rows["small-fp8"]["status"].startswith("skipped: no FP8 here")
    curves = {(row["op_class"], row["dtype"]) for row in csv.DictReader((checked / "curves.csv").open())}
    assert {("attention", "bf16"), ("grouped_matmul", "bf16"), ("matmul", "fp32")} <= curves


def test_one_device_profile_takes_its_links_from_the_named_cluster(checked: Path, tmp_path: Path) -> None:
    """A single-GPU machine (the script's profile step): its device is measured, its links are the named
    profile's, each source saying so; without --links-from, one sentence."""
    profile, cluster = load_profile(checked / "profile.yaml"), load_profile("cpu-gloo")
    assert profile.device.op_overhead is not None and profile.device.memory_bandwidth_bytes_per_s > 0
    assert profile.devices_per_node == cluster.devices_per_node and profile.backend == cluster.backend
    assert profile.intra_node.collectives == cluster.intra_node.collectives
    assert "copied from profile 'cpu-gloo'" in profile.intra_node.name and "copied" in profile.comm_overlap.source
    refused = cli_here("profile", "--devices", 1, "--out", tmp_path / "x.yaml")  # refused before measuring anything
    assert refused.returncode != 0 and "--links-from" in refused.stderr and "Traceback" not in refused.stderr
