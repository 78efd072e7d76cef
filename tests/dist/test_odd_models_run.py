"""Oddly shaped models run their plans for real on gloo and match the single-process reference."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from autoplan.solve.api import plan_graph
from autoplan.trace import trace_model_file

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
ODD = ROOT / "tests/odd_models"


@pytest.mark.parametrize("name, fix", [
    ("two_modules", "dp=2,zero=3"),
    ("two_modules", "pp=2"),  # the textbook pipeline: cut between two unlike top-level modules
    ("unlike_modules", "pp=2,schedule=1f1b,mbs=2"),  # called out of registration order; sends an LSTM's view
    ("one_block", "tp=2"),
    ("mixed_blocks", "pp=2,schedule=1f1b,mbs=2"),
    ("nested", "pp=2,recompute=full"),
    ("shared_module", "dp=2,zero=1"),
    ("side_effects", "pp=2,schedule=gpipe"),
    ("loop_moe", "dp=2,recompute=full"),
    ("loop_moe", "tp=2,sp=true"),  # the MoE loop runs whole on each tp rank, on the gathered sequence
])
def test_odd_model_runs_its_plan_and_verifies(tmp_path, name, fix):
    plan = plan_graph(trace_model_file(ODD / f"{name}.py", 8), devices=2, profile="cpu-gloo", fix=fix).best
    path = plan.save(tmp_path / "plan.json")
    result = subprocess.run([sys.executable, "-m", "autoplan.cli", "run", str(ODD / f"{name}.py"), "--plan", str(path),
                             "--steps", "2", "--verify", "--out", str(tmp_path / "run")],
                            capture_output=True, text=True, timeout=240, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "verify: PASSED" in result.stdout
