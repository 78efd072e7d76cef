"""`autoplan run --trace` end to end on gloo (2 ranks, pp=2): every rank's trace carries the plan's stage and
thread names and its chunks' F/B names, and `autoplan report` aligns it with timeline.json in timeline_diff.csv. The
plan and the report (no process group) run the CLI's main in this process (exec_harness.cli_here)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from exec_harness import cli_here
from exec_models import SMALL_GPT

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
MICROBATCHES = 4


def _cli(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, **SMALL_GPT)
    return subprocess.run(
        [sys.executable, "-m", "autoplan.cli", *args], capture_output=True, text=True, env=env, timeout=300, cwd=ROOT
    )


@pytest.fixture(scope="module")
def traced(tmp_path_factory):
    root = tmp_path_factory.mktemp("traced")
    gpt = str(ROOT / "examples/gpt.py")
    pins = "pp=2,schedule=1f1b,mbs=1"
    done = cli_here("--quiet", "plan", gpt, "--devices", "2", "--batch", str(MICROBATCHES), "--profile", "cpu-gloo",
                    "--fix", pins, "--out", str(root / "plan"), env=SMALL_GPT)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    done = _cli("run", gpt, "--plan", str(root / "plan"), "--steps", "3", "--trace", "--trace-steps", "1,2",
                "--out", str(root / "run"))  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = cli_here("report", root / "plan", root / "run", "--out", root / "report", "--no-explain", env=SMALL_GPT)
    assert report.returncode == 0, report.stderr[-3000:]
    return root, report.stdout


def test_every_rank_writes_a_trace_per_traced_step_with_the_plans_names(traced):
    root, _ = traced
    assert json.loads((root / "plan/plan.json").read_text())["num_microbatches"] == MICROBATCHES
    files = sorted(p.name for p in (root / "run/traces").iterdir())
    assert files == ["rank0_step1.json", "rank0_step2.json", "rank1_step1.json", "rank1_step2.json"]
    for rank in (0, 1):
        trace = json.loads((root / f"run/traces/rank{rank}_step2.json").read_text())
        meta = [e for e in trace["traceEvents"] if e["ph"] == "M"]
        assert {e["args"]["name"] for e in meta if e["name"] == "process_name"} == {f"stage {rank}"}
        threads = {e["tid"]: e["args"]["name"] for e in meta if e["name"] == "thread_name"}
        assert threads[0] == "compute" and threads[3] == "pp"
        events = [e for e in trace["traceEvents"] if e["ph"] == "X"]
        chunks = {e["name"] for e in events if e["tid"] == 0 and e["cat"] in ("forward", "backward")}
        assert chunks == {f"{k} mb{i} c{rank}" for k in "FB" for i in range(MICROBATCHES)}
        sends = [e for e in events if e["tid"] == 3]
        assert sends and all(e["args"]["bytes"] > 0 and e["name"].startswith("pp ") for e in sends)
        assert all(e["ts"] >= 0 for e in events) and trace["otherData"]["step"] == 2


def test_report_aligns_the_measured_chunks_with_the_predicted_ones(traced):
    root, stdout = traced
    assert "measured against predicted" in stdout
    predicted = json.loads((root / "report/timeline.json").read_text())
    assert predicted == json.loads((root / "plan/timeline.json").read_text())
    diff = pd.read_csv(root / "report/timeline_diff.csv")
    chunks = diff[diff["what"] == "chunk"]
    expected = {(k, f"{f} mb{i} c{k}") for k in (0, 1) for f in "FB" for i in range(MICROBATCHES)}
    assert set(zip(chunks["stage"], chunks["event"])) == expected
    assert (chunks["predicted_s"] > 0).all() and (chunks["measured_s"] > 0).all()
    assert (chunks["measured_traces"] == 2).all()  # one rank per stage, two traced steps
    assert chunks["ratio"].to_numpy() == pytest.approx((chunks["measured_s"] / chunks["predicted_s"]).to_numpy())
    assert set(diff.loc[diff["what"] == "step", "stage"]) == {0, 1}
    assert {"pp"} <= set(diff.loc[diff["what"] == "communication", "event"])
    assert list(diff["diff_ms"].dropna()) == sorted(diff["diff_ms"].dropna(), reverse=True)
