"""`autoplan launch --slurm`'s script, run for real: fake ``srun`` and ``scontrol`` on PATH make one
machine two Slurm "nodes" of one rank each, whose torchruns meet in the script's c10d rendezvous
and train a small GPT with dp=2 on gloo; a second job with more steps resumes from the first's
checkpoint, as a requeued job does."""

from __future__ import annotations

import csv
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from autoplan.jobs.slurm import sbatch_options
from autoplan.types.plan import Plan

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
SMALL_GPT = {
    "AUTOPLAN_GPT_N_LAYER": "2",
    "AUTOPLAN_GPT_N_EMBD": "32",
    "AUTOPLAN_GPT_N_HEAD": "4",
    "AUTOPLAN_GPT_VOCAB_SIZE": "128",
    "AUTOPLAN_GPT_BLOCK_SIZE": "16",
}
#: srun: drop srun's own options, then start the per-node command once per node, as Slurm does.
FAKE_SRUN = """#!/bin/bash
while [[ "$1" == --* ]]; do shift; done
pids=()
for node in $(seq 0 $((SLURM_NNODES - 1))); do
  SLURM_NODEID=$node SLURM_PROCID=$node "$@" > "$FAKE_SLURM_LOGS/node$node.log" 2>&1 &
  pids+=($!)
done
rc=0
for pid in "${pids[@]}"; do wait "$pid" || rc=$?; done
exit $rc
"""
FAKE_SCONTROL = """#!/bin/bash
[[ "$1 $2" == "show hostnames" ]] && echo 127.0.0.1
"""


def _shims(folder: Path) -> Path:
    folder.mkdir()
    for name, text in (("srun", FAKE_SRUN), ("scontrol", FAKE_SCONTROL)):
        (folder / name).write_text(text)
        (folder / name).chmod(0o755)
    return folder


def _launch(tmp_path: Path, *, steps: int) -> Path:
    from autoplan.jobs.launcher import free_port

    made = subprocess.run(
        [sys.executable, "-m", "autoplan.cli", "launch", str(ROOT / "examples/gpt.py"), str(tmp_path / "plan.json")]
        + ["--slurm", "--gpus-per-node", "1", "--steps", str(steps), "--rdzv-port", str(free_port())],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert made.returncode == 0, made.stderr
    assert f"sbatch {tmp_path / 'launch.sbatch'}" in made.stdout
    return tmp_path / "launch.sbatch"


def _run_job(script: Path, *, shims: Path, logs: Path) -> subprocess.CompletedProcess:
    logs.mkdir(exist_ok=True)
    env = dict(
        os.environ,
        **SMALL_GPT,
        PATH=f"{shims}{os.pathsep}{os.environ['PATH']}",
        SLURM_NNODES="2",
        SLURM_JOB_NODELIST="localhost",
        SLURM_JOB_ID="4242",
        FAKE_SLURM_LOGS=str(logs),
    )
    return subprocess.run(["bash", str(script)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)


def _losses(run: Path) -> list[float]:
    return [float(row["loss"]) for row in csv.DictReader((run / "measured.csv").open())]


def _logs(logs: Path) -> str:
    return "\n".join(f"--- {path.name}\n{path.read_text()[-3000:]}" for path in sorted(logs.glob("*.log")))


def test_the_sbatch_script_trains_on_two_nodes_and_a_requeue_resumes(tmp_path):
    Plan(devices=2, dp=2, tp=1, pp=1, micro_batch_size=2, num_microbatches=1, profile="cpu-gloo").save(
        tmp_path / "plan.json"
    )
    shims = _shims(tmp_path / "bin")
    script = _launch(tmp_path, steps=2)
    options = sbatch_options(script.read_text())
    assert options["--nodes"] == "2" and options["--ntasks-per-node"] == "1" and "--requeue" in options
    assert "--gpus-per-node" not in options  # the cpu-gloo profile: CPU nodes

    first = _run_job(script, shims=shims, logs=tmp_path / "logs1")
    assert first.returncode == 0, first.stderr[-2000:] + _logs(tmp_path / "logs1")
    assert "rendezvous at 127.0.0.1" in first.stdout
    first_losses = _losses(tmp_path / "run")
    assert len(first_losses) == 2 and all(math.isfinite(loss) for loss in first_losses)
    assert (tmp_path / "run/summary.json").is_file() and (tmp_path / "checkpoints/step-00000002").is_dir()

    # the same job with more steps (a requeue of a longer job) continues from the checkpoint
    resumed = _run_job(_launch(tmp_path, steps=4), shims=shims, logs=tmp_path / "logs2")
    assert resumed.returncode == 0, resumed.stderr[-2000:] + _logs(tmp_path / "logs2")
    assert "step-00000002 at step 2 of 4" in _logs(tmp_path / "logs2")
    losses = _losses(tmp_path / "run")
    assert losses[:2] == first_losses and len(losses) == 4 and all(math.isfinite(loss) for loss in losses)
