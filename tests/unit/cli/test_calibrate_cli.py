"""`autoplan calibrate`: a real run folder round trip, and bad input -> one line, exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autoplan.cli import main
from autoplan.profile import load_profile
from autoplan.types.plan import Plan

MODEL = """
import os
import torch
import torch.nn as nn

WIDTH = int(os.environ.get("AUTOPLAN_TINY_WIDTH", "64"))

def build_model():
    return nn.Sequential(nn.Linear(WIDTH, 4 * WIDTH), nn.GELU(), nn.Linear(4 * WIDTH, WIDTH))

def example_inputs(batch_size):
    return (torch.randn(batch_size, WIDTH),)
"""


def _run_folder(
    tmp_path: Path,
    name: str,
    *,
    measured_s: float = 0.05,
    profile: str = "cpu-gloo",
    width: int = 64,
    summary: bool = True,
) -> Path:
    model = tmp_path / "tiny.py"
    model.write_text(MODEL)
    folder = tmp_path / name
    folder.mkdir()
    plan = Plan(devices=2, dp=2, tp=1, pp=1, micro_batch_size=4, num_microbatches=1, model="tiny", profile=profile)
    plan.save(folder / "plan.json")
    if summary:
        (folder / "summary.json").write_text(
            json.dumps(
                {
                    "plan": plan.describe(),
                    "backend": "gloo",
                    "median_step_time_s": measured_s,
                    "model_file": str(model),
                    "global_batch_size": 8,
                    "environment": {"AUTOPLAN_TINY_WIDTH": str(width)},
                }
            )
        )
    return folder


def _one_line_error(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("autoplan: error:")
    return err


def test_calibrate_writes_a_recorded_profile(tmp_path, capsys):
    runs = [_run_folder(tmp_path, f"run{i}", measured_s=0.02 * (i + 1), width=32 * (i + 1)) for i in range(3)]
    out = tmp_path / "calibrated.yaml"
    assert main(["calibrate", *map(str, runs), "--profile", "cpu-gloo", "--out", str(out), "--quiet"]) == 0
    calibrated = load_profile(out)
    record = calibrated.calibration
    assert [Path(r["folder"]).name for r in record["runs"]] == ["run0", "run1", "run2"]
    assert record["runs"][2]["environment"] == {"AUTOPLAN_TINY_WIDTH": "96"}
    assert record["error_after"]["median_abs_pct"] < record["error_before"]["median_abs_pct"]
    assert record["versions"]["autoplan"] and record["date"]
    # widths 32/64/96 trace to different graphs: their predictions differ
    assert len({r["predicted_before_s"] for r in record["runs"]}) == 3


def test_missing_run_folder(tmp_path, capsys):
    assert main(["calibrate", str(tmp_path / "nope"), "--profile", "cpu-gloo", "--out", str(tmp_path / "p.yaml")]) == 2
    assert "does not exist" in _one_line_error(capsys)


def test_run_without_summary(tmp_path, capsys):
    folder = _run_folder(tmp_path, "unfinished", summary=False)
    assert main(["calibrate", str(folder), "--profile", "cpu-gloo", "--out", str(tmp_path / "p.yaml")]) == 2
    assert "has no summary.json" in _one_line_error(capsys)


def test_profile_mismatch(tmp_path, capsys):
    folder = _run_folder(tmp_path, "a100run", profile="dgx-a100")
    assert main(["calibrate", str(folder), "--profile", "cpu-gloo", "--out", str(tmp_path / "p.yaml")]) == 2
    assert "made for profile 'dgx-a100'" in _one_line_error(capsys)


def test_bad_output_suffix(tmp_path, capsys):
    folder = _run_folder(tmp_path, "run")
    assert main(["calibrate", str(folder), "--profile", "cpu-gloo", "--out", str(tmp_path / "p.txt")]) == 2
    assert "suffix" in _one_line_error(capsys)
    assert not (tmp_path / "p.txt").exists()


def test_executor_records_what_calibration_needs(tmp_path, monkeypatch):
    from autoplan.execute.job.outputs import run_inputs
    from autoplan.types.run_options import RunOptions

    monkeypatch.setenv("AUTOPLAN_TINY_WIDTH", "32")
    monkeypatch.setenv("AUTOPLAN_ERROR_DIR", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    plan = Plan(devices=2, dp=2, tp=1, pp=1, micro_batch_size=4, num_microbatches=3)
    recorded = run_inputs(opts=RunOptions(model="tiny.py", plan="p/plan.json", steps=2, out="run"), plan=plan)
    assert recorded["model_file"] == str(tmp_path / "tiny.py") and recorded["global_batch_size"] == 24
    assert (
        recorded["environment"]["AUTOPLAN_TINY_WIDTH"] == "32" and "AUTOPLAN_ERROR_DIR" not in recorded["environment"]
    )


def test_run_noise_from_its_own_steps(tmp_path):
    import math

    from autoplan.calibrate.runs import CalibrationError, median_noise_sigma
    from autoplan.types.run_folder import RunFolder

    def step_times(name: str, text: str) -> list[float] | None:
        folder = tmp_path / name
        folder.mkdir()
        (folder / "summary.json").write_text("{}")
        if text:
            (folder / "measured.csv").write_text(text)
        return RunFolder.read(folder, error=CalibrationError).step_times_s()

    steady = step_times("steady", "step,step_time_s\n" + "".join(f"{i},0.5\n" for i in range(8)))
    times = [9.0, 9.0, 0.4, 0.5, 0.6, 0.4, 0.5, 0.6]  # two warm-up steps, then +-20 %
    noisy = step_times("noisy", "step,step_time_s\n" + "".join(f"{i},{t}\n" for i, t in enumerate(times)))
    assert noisy == times
    assert median_noise_sigma(steady, skip=2) == 0.0
    q1, q3 = math.log(0.4), math.log(0.6)  # statistics.quantiles (exclusive) of the 6 timed steps
    assert median_noise_sigma(noisy, skip=2) == pytest.approx(1.2533 * (q3 - q1) / 1.349 / math.sqrt(6))
    assert step_times("absent", "") is None and step_times("untimed", "step,loss\n0,1.0\n") is None
    assert median_noise_sigma(noisy, skip=6) is None  # too few timed steps to say
