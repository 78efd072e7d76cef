"""benchmarks/gpu_check.sh, the script a lent GPU runs, run on this CPU (GPU_CHECK_DEVICE=cpu: quick
sweep, tiny GPTs, 2 steps): it measures a profile with the attention and grouped-GEMM curves, plans and
runs each case it can, skips the others with a reason, and writes summary.csv and curves.csv."""

from __future__ import annotations

import csv
import os
import subprocess
from pathlib import Path

import pytest

from autoplan.profile import load_profile

ROOT = Path(__file__).resolve().parents[2]
#: the compiled case is left out here: tests/dist/test_execute.py and test_audit.py run compiled blocks on
#: gloo already, and inductor's compile is most of this script's CPU time
CASES = {"small-bf16", "small-fp8"}


@pytest.mark.slow
def test_gpu_check_runs_on_a_cpu_device(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "GPU_CHECK_DEVICE": "cpu",
        "PYTHONPATH": str(ROOT),
        "GPU_CHECK_BUDGET_S": "400",
        "GPU_CHECK_CASES": " ".join(sorted(CASES)),
    }
    done = subprocess.run(
        ["bash", str(ROOT / "benchmarks" / "gpu_check.sh"), str(tmp_path)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=500,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    profile = load_profile(tmp_path / "profile.yaml")
    assert {"matmul", "attention", "grouped_matmul"} <= set(profile.device.efficiency)
    rows = {row["case"]: row for row in csv.DictReader((tmp_path / "summary.csv").open())}
    assert set(rows) == CASES
    row = rows["small-bf16"]
    assert row["status"] == "ok", row
    assert all(float(row[key]) > 0 for key in ("measured_step_s", "predicted_step_s", "predicted_datasheet_step_s"))
    assert rows["small-fp8"]["status"].startswith("skipped: no FP8 here")
    curves = {(row["op_class"], row["dtype"]) for row in csv.DictReader((tmp_path / "curves.csv").open())}
    assert {("attention", "bf16"), ("grouped_matmul", "bf16"), ("matmul", "fp32")} <= curves
