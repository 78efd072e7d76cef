"""The sbatch script's stops: the lead time and torchrun's shutdown timeout come from the plan's
predicted checkpoint write, and the script itself, run with stub ``srun`` and ``scontrol``,
stops the step and requeues at the time limit (USR1), or only stops on a SIGTERM."""

from __future__ import annotations

import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from autoplan.cli import main
from autoplan.errors import RunError
from autoplan.jobs.nodejob import NodeJob, executor_args
from autoplan.jobs.slurm import sbatch_options, sbatch_script, stop_times, time_limit_s
from autoplan.types.plan import Plan
from autoplan.types.prediction import Prediction

ARGS = executor_args(model="/m.py", plan="/p.json", steps=9, run_dir="/r", checkpoint_dir="/ck")
#: srun: a step that trains until SIGTERM, which it logs before it exits as a stopped rank does (143)
STEP_SRUN = """#!/bin/bash
trap 'echo "step: SIGTERM" >> "$FAKE_LOG"; exit 143' TERM
echo "step: started" >> "$FAKE_LOG"
[[ -n "${STEP_EXIT:-}" ]] && exit "$STEP_EXIT"
while true; do sleep 0.05; done
"""
SCONTROL = """#!/bin/bash
if [[ "$1 $2" == "show hostnames" ]]; then echo node007; else echo "scontrol $*" >> "$FAKE_LOG"; fi
"""


def test_the_stop_times_come_from_the_predicted_step_and_checkpoint_write():
    """D = T_step + W = 1.5 + 40.2 s: shutdown = ceil(2 D) + 60 = 144 s, lead = 144 + 60 = 204 s."""
    stop = stop_times(step_time_s=1.5, checkpoint_write_s=40.2)
    assert (stop.shutdown_timeout_s, stop.signal_lead_s) == (144, 204)
    assert "40.2 s" in stop.basis
    unknown = stop_times(step_time_s=1.5, checkpoint_write_s=None)
    assert (unknown.shutdown_timeout_s, unknown.signal_lead_s) == (60, 120) and "storage" in unknown.basis
    with pytest.raises(RunError, match="more than Slurm's --signal can warn ahead"):
        stop_times(step_time_s=1.0, checkpoint_write_s=40000.0)


@pytest.mark.parametrize(
    ("limit", "seconds"),
    [("30", 1800), ("10:30", 630), ("1:00:00", 3600), ("1-2", 93600), ("1-2:30", 95400), ("2-00:00:10", 172810)],
)
def test_slurm_time_limits_in_seconds(limit, seconds):
    assert time_limit_s(limit) == seconds


def _script(tmp_path: Path, *, time_limit: str = "1:00:00") -> Path:
    job = NodeJob(name="autoplan-gpt", devices=4, gpus_per_node=2, executor_args=ARGS)
    stop = stop_times(step_time_s=1.5, checkpoint_write_s=40.2)
    path = tmp_path / "job.sbatch"
    path.write_text(sbatch_script(job, time_limit=time_limit, output="/logs/%j.out", stop=stop))
    return path


def test_a_time_limit_within_the_lead_is_one_sentence(tmp_path):
    with pytest.raises(RunError, match=r"--time 3 \(180 s\) leaves no time to train .* 204 s ahead"):
        _script(tmp_path, time_limit="3")


def _start(tmp_path: Path, **env) -> tuple[subprocess.Popen, Path]:
    """Run the script with stub srun and scontrol; return once the step runs."""
    bin_dir, log = tmp_path / "bin", tmp_path / "slurm.log"
    bin_dir.mkdir()
    for name, text in (("srun", STEP_SRUN), ("scontrol", SCONTROL)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "FAKE_LOG": str(log), "SLURM_NNODES": "2", **env}
    script = _script(tmp_path)
    job = subprocess.Popen(
        ["bash", str(script)], env={**env, "SLURM_JOB_NODELIST": "n[7-8]", "SLURM_JOB_ID": "77"}, text=True
    )
    while job.poll() is None and "step: started" not in (log.read_text() if log.exists() else ""):
        time.sleep(0.02)
    return job, log


def test_usr1_before_the_time_limit_stops_the_step_then_requeues_the_job(tmp_path):
    job, log = _start(tmp_path)
    job.send_signal(signal.SIGUSR1)  # what --signal=B:USR1@204 sends the batch shell
    assert job.wait(timeout=60) == 0
    assert log.read_text().splitlines() == ["step: started", "step: SIGTERM", "scontrol requeue 77"]
    assert sbatch_options(_script(tmp_path).read_text())["--signal"] == "B:USR1@204"


def test_a_sigterm_stops_the_step_without_a_requeue(tmp_path):
    job, log = _start(tmp_path)
    job.send_signal(signal.SIGTERM)  # scancel, or a preemption (Slurm requeues those itself)
    assert job.wait(timeout=60) == 143
    assert log.read_text().splitlines() == ["step: started", "step: SIGTERM"]


@pytest.mark.parametrize("code", [0, 3])
def test_a_step_that_ends_by_itself_is_the_jobs_exit_and_no_requeue(tmp_path, code):
    job, log = _start(tmp_path, STEP_EXIT=str(code))
    assert job.wait(timeout=60) == code
    assert log.read_text().splitlines() == ["step: started"]


# ---- the command: the plan's prediction sets the times -----------------------------------------------


def test_launch_derives_the_stop_times_from_the_plan_and_says_so(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    shutil.copy(Path(__file__).resolve().parents[3] / "examples/gpt.py", tmp_path / "gpt.py")
    predicted = Prediction(step_time_s=1.5, checkpoint_write_s=40.2)
    plan = Plan(
        devices=16, dp=16, tp=1, pp=1, micro_batch_size=1, num_microbatches=1, profile="dgx-h100", predicted=predicted
    )
    plan.save("plan.json")
    assert main(["launch", "gpt.py", "plan.json", "--slurm"]) == 0
    out = capsys.readouterr().out
    assert "SIGTERM 204 s before it and torchrun waits up to 144 s" in out and "checkpoint write (40.2 s)" in out
    script = (tmp_path / "launch.sbatch").read_text()
    assert sbatch_options(script)["--signal"] == "B:USR1@204" and "--shutdown-timeout=144 " in script


def test_a_torchrun_without_shutdown_timeout_gets_no_such_flag(tmp_path, monkeypatch, capsys):
    """An older torch's torchrun rejects the unknown flag (the job would fail at once); launch says
    that its ranks get torchrun's fixed 30 s instead."""
    import autoplan.cli.launch as launch

    assert launch.torchrun_has_shutdown_timeout()  # torch 2.13's torchrun has it
    monkeypatch.setattr(launch, "torchrun_has_shutdown_timeout", lambda: False)
    monkeypatch.chdir(tmp_path)
    shutil.copy(Path(__file__).resolve().parents[3] / "examples/mlp.py", tmp_path / "mlp.py")
    Plan(devices=2, dp=2, tp=1, pp=1, micro_batch_size=1, num_microbatches=1, profile="dgx-h100").save("plan.json")
    assert main(["launch", "mlp.py", "plan.json", "--slurm", "--gpus-per-node", "2"]) == 0
    assert "torchrun (this torch's, without --shutdown-timeout) waits 30 s" in capsys.readouterr().out
    script = (tmp_path / "launch.sbatch").read_text()
    assert "--shutdown-timeout" not in script and "--signal=B:USR1@120" in script
    assert subprocess.run(["bash", "-n", str(tmp_path / "launch.sbatch")]).returncode == 0
