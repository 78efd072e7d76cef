"""`autoplan launch --slurm`'s script, run for real: fake ``srun`` and ``scontrol`` on PATH make one
machine two Slurm "nodes" of one rank each, whose torchruns meet in the script's c10d rendezvous
and train a small GPT with dp=2 on gloo. The script sets the GPT's sizes itself (the job's shell has
none). USR1 (what ``--signal=B:USR1@LEAD`` sends before the time limit) makes the script stop the
step: srun passes SIGTERM to each torchrun, the ranks write a final checkpoint, and the script
requeues the job; a job with two more steps then resumes from that checkpoint, as the requeue does.
"""

from __future__ import annotations

import csv
import math
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from exec_harness import cli_here
from exec_models import SMALL_GPT

from autoplan.jobs.slurm import sbatch_options
from autoplan.modelfile import load_model_file
from autoplan.trace.identity import model_signature
from autoplan.types.plan import Plan

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
#: srun: drop srun's own options, then start the per-node command once per node, as Slurm does;
#: a SIGTERM is passed on to every node's command, as srun passes it to the job step.
FAKE_SRUN = """#!/bin/bash
while [[ "$1" == --* ]]; do shift; done
pids=()
for node in $(seq 0 $((SLURM_NNODES - 1))); do
  SLURM_NODEID=$node SLURM_PROCID=$node "$@" > "$FAKE_SLURM_LOGS/node$node.log" 2>&1 &
  pids+=($!)
done
trap 'kill -TERM "${pids[@]}" 2>/dev/null' TERM
rc=0
for pid in "${pids[@]}"; do
  wait "$pid"; code=$?
  while kill -0 "$pid" 2>/dev/null; do wait "$pid"; code=$?; done  # a trap ended the wait early
  [[ $code -ne 0 ]] && rc=$code
done
exit $rc
"""
FAKE_SCONTROL = """#!/bin/bash
if [[ "$1 $2" == "show hostnames" ]]; then echo 127.0.0.1; else echo "scontrol $*" >> "$FAKE_SLURM_LOGS/scontrol"; fi
"""


def _shims(folder: Path) -> Path:
    folder.mkdir()
    for name, text in (("srun", FAKE_SRUN), ("scontrol", FAKE_SCONTROL)):
        (folder / name).write_text(text)
        (folder / name).chmod(0o755)
    return folder


def _launch(tmp_path: Path, *, steps: int) -> Path:
    """``autoplan launch --slurm``'s script, written by the CLI's main in this process (it starts no process)."""
    from autoplan.jobs.launcher import free_port

    made = cli_here(
        *("launch", ROOT / "examples/gpt.py", tmp_path / "plan.json", "--slurm", "--gpus-per-node", 1),
        *("--steps", steps, "--rdzv-port", free_port(), "--checkpoint-every", 1),
        env=SMALL_GPT,  # the sizes the plan was made with
    )
    assert made.returncode == 0, made.stderr
    assert f"sbatch {tmp_path / 'launch.sbatch'}" in made.stdout
    return tmp_path / "launch.sbatch"


def _job(script: Path, *, shims: Path, logs: Path) -> subprocess.Popen:
    """The batch script as Slurm starts it on the first node: without the submitting shell's variables."""
    logs.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("AUTOPLAN_GPT_")}
    env.update(
        PATH=f"{shims}{os.pathsep}{os.environ['PATH']}",
        SLURM_NNODES="2",
        SLURM_JOB_NODELIST="localhost",
        SLURM_JOB_ID="4242",
        FAKE_SLURM_LOGS=str(logs),
    )
    return subprocess.Popen(["bash", str(script)], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _finish(job: subprocess.Popen, logs: Path) -> str:
    out, err = job.communicate(timeout=180)
    assert job.returncode == 0, err.decode()[-2000:] + _logs(logs)
    return out.decode()


def _losses(run: Path) -> list[float]:
    return [float(row["loss"]) for row in csv.DictReader((run / "measured.csv").open())]


def _logs(logs: Path) -> str:
    return "\n".join(f"--- {path.name}\n{path.read_text()[-3000:]}" for path in sorted(logs.glob("*.log")))


def _plan(tmp_path: Path, monkeypatch) -> None:
    """A dp=2 plan for the small GPT, with its graph signature (so launch checks the sizes)."""
    for name, value in SMALL_GPT.items():
        monkeypatch.setenv(name, value)
    signature = model_signature(load_model_file(ROOT / "examples/gpt.py"))
    made_for = {"model": "gpt", "graph_signature": signature, "profile": "cpu-gloo"}
    Plan(devices=2, dp=2, tp=1, pp=1, micro_batch_size=2, num_microbatches=1, **made_for).save(tmp_path / "plan.json")


def test_the_sbatch_script_trains_on_two_nodes_checkpoints_at_the_time_limit_and_a_requeue_resumes(
    tmp_path, monkeypatch
):
    _plan(tmp_path, monkeypatch)
    shims = _shims(tmp_path / "bin")
    script = _launch(tmp_path, steps=100000)  # never done before the "time limit"
    options = sbatch_options(script.read_text())
    assert options["--nodes"] == "2" and options["--ntasks-per-node"] == "1" and "--requeue" in options
    assert "--gpus-per-node" not in options  # the cpu-gloo profile: CPU nodes
    assert "export AUTOPLAN_GPT_N_LAYER=2" in script.read_text()

    logs = tmp_path / "logs1"
    first = _job(script, shims=shims, logs=logs)
    # any checkpoint: the store keeps the newest few, so step 1's may be gone before a poll sees it
    while first.poll() is None and not (tmp_path / "checkpoints/latest").exists():
        time.sleep(0.1)
    first.send_signal(signal.SIGUSR1)  # what --signal=B:USR1@LEAD sends before the time limit
    out = _finish(first, logs)
    assert "rendezvous at 127.0.0.1" in out and "checkpointing, then requeueing job 4242" in out
    assert (logs / "scontrol").read_text() == "scontrol requeue 4242\n"
    stopped = int((tmp_path / "checkpoints/latest").read_text().strip().split("-")[1])
    first_losses = _losses(tmp_path / "run")
    assert len(first_losses) == stopped >= 1 and all(math.isfinite(loss) for loss in first_losses)

    # the requeued job (here: one whose total is two steps more) continues from that checkpoint
    logs = tmp_path / "logs2"
    _finish(_job(_launch(tmp_path, steps=stopped + 2), shims=shims, logs=logs), logs)
    assert f"step-{stopped:08d} at step {stopped} of {stopped + 2}" in _logs(logs)
    losses = _losses(tmp_path / "run")
    assert losses[:stopped] == first_losses and len(losses) == stopped + 2
    assert all(math.isfinite(loss) for loss in losses)
