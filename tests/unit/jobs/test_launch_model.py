"""`autoplan launch` and the model: a plan made for another model, or for other sizes of this one, is
refused in one sentence; the sizes the plan was checked against (the ``AUTOPLAN_*`` variables set at
launch) are written into the Slurm script, the SkyPilot task and the TorchX component, so the ranks
on a node's fresh shell build that model; autoplan's own run controls are not."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from autoplan.cli import main
from autoplan.modelfile import load_model_file
from autoplan.trace.identity import model_signature
from autoplan.types.plan import Plan

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
#: srun that prints what each rank's model would read, instead of starting torchrun
ENV_SRUN = '#!/bin/bash\necho "depth=${AUTOPLAN_MLP_DEPTH:-unset} fault=${AUTOPLAN_INJECT_FAULT:-unset}"\n'
HOSTNAMES = "#!/bin/bash\necho node007\n"


@pytest.fixture
def work(tmp_path, monkeypatch):
    """A folder with mlp.py and a plan made for it at AUTOPLAN_MLP_DEPTH=2 (its graph signature)."""
    monkeypatch.chdir(tmp_path)
    shutil.copy(EXAMPLES / "mlp.py", tmp_path / "mlp.py")
    monkeypatch.setenv("AUTOPLAN_MLP_DEPTH", "2")
    signature = model_signature(load_model_file("mlp.py"))
    sizes = {"model": "mlp", "graph_signature": signature, "profile": "cpu-gloo"}
    Plan(devices=4, dp=4, tp=1, pp=1, micro_batch_size=1, num_microbatches=1, **sizes).save("plan.json")
    return tmp_path


def _run_script(work: Path, script: Path, env: dict) -> str:
    for name, text in (("srun", ENV_SRUN), ("scontrol", HOSTNAMES)):
        (work / name).write_text(text)
        (work / name).chmod(0o755)
    env = {"PATH": f"{work}:/usr/bin:/bin", "SLURM_NNODES": "2", "SLURM_JOB_NODELIST": "n", "SLURM_JOB_ID": "1", **env}
    done = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_slurm_script_sets_the_sizes_the_plan_was_made_with(work, monkeypatch, capsys):
    monkeypatch.setenv("AUTOPLAN_INJECT_FAULT", "0:1")  # a run control of autoplan's, not a size
    assert main(["launch", "mlp.py", "plan.json", "--slurm", "--gpus-per-node", "2"]) == 0
    assert "AUTOPLAN_MLP_DEPTH=2 (set here; checked against the plan's graph signature)" in capsys.readouterr().out
    script = (work / "launch.sbatch").read_text()
    assert "export AUTOPLAN_MLP_DEPTH=2\n" in script and "AUTOPLAN_INJECT_FAULT" not in script
    # the node's shell has none of the launching shell's variables: the script sets them itself
    assert "depth=2 fault=unset" in _run_script(work, work / "launch.sbatch", env={})


def test_the_cloud_files_set_the_sizes_too(work):
    assert main(["launch", "mlp.py", "plan.json", "--skypilot", "--gpus-per-node", "2", "--accelerator", "H100"]) == 0
    assert yaml.safe_load((work / "sky.yaml").read_text())["envs"] == {"AUTOPLAN_MLP_DEPTH": "2"}
    assert main(["launch", "mlp.py", "plan.json", "--torchx", "--gpus-per-node", "2", "--max-retries", "0"]) == 0
    assert 'env={"AUTOPLAN_MLP_DEPTH": "2"}' in (work / "torchx_job.py").read_text()


def test_a_plan_for_other_sizes_is_refused_in_one_sentence(work, monkeypatch, capsys):
    monkeypatch.setenv("AUTOPLAN_MLP_DEPTH", "3")
    assert main(["launch", "mlp.py", "plan.json", "--slurm", "--gpus-per-node", "2"]) == 2
    err = capsys.readouterr().err
    assert "was made for mlp.py with other parameters" in err and err.count("\n") == 1, err
    assert not (work / "launch.sbatch").exists()


def test_a_plan_for_another_model_is_refused_in_one_sentence(work, capsys):
    shutil.copy(EXAMPLES / "resnet.py", work / "resnet.py")
    assert main(["launch", "resnet.py", "plan.json", "--slurm", "--gpus-per-node", "2", "--json"]) == 2
    err = capsys.readouterr().err
    assert "was made for 'mlp'" in err and "not for resnet.py" in err and err.count("\n") == 1, err


def test_json_output_names_the_sizes_and_the_stop_times(work, capsys):
    assert main(["launch", "mlp.py", "plan.json", "--slurm", "--gpus-per-node", "2", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["environment"] == {"AUTOPLAN_MLP_DEPTH": "2"}
    assert (report["shutdown_timeout_s"], report["signal_lead_s"]) == (60, 120)  # cpu-gloo prices no checkpoint
