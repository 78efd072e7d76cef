"""`autoplan launch`'s files: the sbatch script is valid bash whose #SBATCH lines ask for whole
nodes and whose srun runs one torchrun per node (checked by running it with echoing stubs); the
SkyPilot task and the TorchX component load with YAML and, when installed, with the framework's
own loader; bad input is one sentence and exit 2."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from autoplan.cli import main
from autoplan.errors import RunError
from autoplan.jobs.cloud import accelerator_name, skypilot_task, torchx_component
from autoplan.jobs.install import NodeInstall
from autoplan.jobs.nodejob import NodeJob, executor_args
from autoplan.jobs.slurm import sbatch_options, sbatch_script, stop_times
from autoplan.types.plan import Plan

ARGS = executor_args(
    model="/data/my model.py", plan="/data/plan.json", steps=100, run_dir="/data/run", checkpoint_dir="/data/ck"
)
ECHO = '#!/bin/bash\nprintf "%s\\n" "$@"\n'
HOSTNAMES = '#!/bin/bash\nprintf "node007\\nnode008\\n"\n'


def _job(**kw) -> NodeJob:
    kw = {"name": "autoplan-gpt", "devices": 16, "gpus_per_node": 8, "executor_args": ARGS, "accelerator": "H100", **kw}
    return NodeJob(**kw)


#: no predicted checkpoint write: torchrun's 60 s and a 120 s lead (autoplan/jobs/slurm.py stop_times)
DEFAULT_STOP = stop_times(step_time_s=None, checkpoint_write_s=None)


def _script(**kw) -> str:
    return sbatch_script(
        _job(**kw), time_limit="12:00:00", output="/logs/%x-%j.out", partition="gpu", stop=DEFAULT_STOP
    )


def test_the_sbatch_script_is_bash_and_asks_for_whole_nodes(tmp_path):
    path = tmp_path / "job.sbatch"
    path.write_text(_script())
    assert subprocess.run(["bash", "-n", str(path)], capture_output=True).returncode == 0
    options = sbatch_options(path.read_text())
    assert options == {
        "--job-name": "autoplan-gpt",
        "--nodes": "2",
        "--ntasks-per-node": "1",
        "--gpus-per-node": "8",
        "--cpus-per-task": "64",
        "--time": "12:00:00",
        "--partition": "gpu",
        "--output": "/logs/%x-%j.out",
        "--open-mode": "append",
        "--requeue": "",
        "--signal": "B:USR1@120",
    }


def test_srun_starts_one_torchrun_per_node_in_a_c10d_rendezvous_on_the_first_node(tmp_path):
    """Run the script with srun echoing its arguments: the exact argv each node runs."""
    for name, text in (("srun", ECHO), ("scontrol", HOSTNAMES)):
        (tmp_path / name).write_text(text)
        (tmp_path / name).chmod(0o755)
    (tmp_path / "job.sbatch").write_text(_script())
    env = {"PATH": f"{tmp_path}:/usr/bin:/bin", "SLURM_NNODES": "2", "SLURM_JOB_NODELIST": "node[007-008]"}
    done = subprocess.run(
        ["bash", str(tmp_path / "job.sbatch")], env={**env, "SLURM_JOB_ID": "77"}, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    argv = done.stdout.splitlines()[1:]  # after the script's own "autoplan: job ..." line
    assert argv == [
        "--kill-on-bad-exit=1",
        "--cpus-per-task=64",  # srun does not inherit sbatch's --cpus-per-task since Slurm 22.05
        "torchrun",
        "--nnodes=2",
        "--nproc-per-node=8",
        "--rdzv-backend=c10d",
        "--rdzv-endpoint=node007:29500",
        "--rdzv-id=77",
        "--shutdown-timeout=60",
        "-m",
        "autoplan.cli",
        *ARGS,
    ]
    assert "/data/my model.py" in argv


def test_cpu_nodes_ask_for_no_gpus():
    options = sbatch_options(_script(uses_gpus=False, gpus_per_node=2, devices=4))
    assert "--gpus-per-node" not in options and options["--nodes"] == "2" and options["--cpus-per-task"] == "16"


@pytest.mark.parametrize(
    ("kw", "sentence"),
    [
        ({"devices": 12}, "the plan's 12 devices are not whole nodes of 8"),
        ({"gpus_per_node": 0}, "--gpus-per-node 0: expected at least 1"),
        ({"rdzv_port": 70000}, "--rdzv-port 70000"),
        ({"name": "my job"}, "job name 'my job'"),
    ],
)
def test_bad_jobs_are_one_sentence(kw, sentence):
    with pytest.raises(RunError, match=sentence):
        _job(**kw)


def test_a_bad_time_limit_is_one_sentence():
    with pytest.raises(RunError, match="--time '12h'"):
        sbatch_script(_job(), time_limit="12h", output="x.out", stop=DEFAULT_STOP)


@pytest.mark.parametrize(
    ("device", "name"),
    [
        ("NVIDIA H100-SXM5-80GB", "H100"),
        ("NVIDIA H200-SXM-141GB", "H200"),
        ("NVIDIA A100-SXM4-80GB", "A100-80GB"),
        ("NVIDIA A100-SXM4-40GB", "A100"),
        ("Tesla V100-SXM2-16GB", "V100"),
        ("Intel(R) Xeon(R) Processor", None),
    ],
)
def test_accelerator_names_come_from_the_profiles_device(device, name):
    assert accelerator_name(device) == name


def _sky(tmp_path: Path) -> Path:
    path = tmp_path / "sky.yaml"
    path.write_text(skypilot_task(_job(), install=NodeInstall(setup="pip install -e ."), header="a comment"))
    return path


def test_the_skypilot_task_is_yaml_with_nodes_accelerators_and_a_torchrun_per_node(tmp_path):
    task = yaml.safe_load(_sky(tmp_path).read_text())
    assert task["num_nodes"] == 2 and task["resources"] == {"accelerators": "H100:8"}
    assert task["setup"].strip() == "pip install -e ."
    for variable in ("SKYPILOT_NODE_RANK", "SKYPILOT_NODE_IPS", "SKYPILOT_NUM_NODES", "SKYPILOT_NUM_GPUS_PER_NODE"):
        assert f"${variable}" in task["run"]
    (tmp_path / "run.sh").write_text(task["run"])
    assert subprocess.run(["bash", "-n", str(tmp_path / "run.sh")]).returncode == 0


def test_the_skypilot_task_loads_with_skypilot(tmp_path, monkeypatch):
    sky = pytest.importorskip(
        "sky",
        reason="skypilot 0.14.1 cannot be installed beside the test extra's transformers 5.25 (pip: "
        "ResolutionImpossible); it passed in an environment of its own, pip install skypilot==0.14.1 there",
    )
    monkeypatch.setenv("HOME", str(tmp_path))  # offline: no credentials, no config
    task = sky.Task.from_yaml(str(_sky(tmp_path)))
    assert task.num_nodes == 2 and "SKYPILOT_NODE_RANK" in task.run


def test_skypilot_needs_a_known_accelerator():
    with pytest.raises(RunError, match="pass --accelerator"):
        skypilot_task(_job(accelerator=None), install=NodeInstall(setup="true"))


def _component(tmp_path: Path, **volume) -> Path:
    volume = {"max_retries": 3, "checkpoint_volume": "ckpt-claim", **volume}
    path = tmp_path / "torchx_job.py"
    component = torchx_component(
        _job(), image="ghcr.io/me/autoplan:1", cpus_per_node=64, memory_mb_per_node=2048, **volume
    )
    path.write_text(component)
    return path


def test_the_torchx_component_is_python(tmp_path):
    compile(_component(tmp_path).read_text(), "torchx_job.py", "exec")


def test_the_torchx_component_passes_torchx_and_renders_two_nodes(tmp_path):
    pytest.importorskip("torchx", reason="torchx is optional: pip install torchx==0.7.0")
    from torchx.runner import get_runner
    from torchx.specs.file_linter import validate

    path = _component(tmp_path)
    assert validate(str(path), "train") == []
    slurm = get_runner().dryrun_component(f"{path}:train", [], "slurm", cfg={}).request.materialize()
    assert slurm.count("--nnodes 2 --nproc_per_node 8") == 2 and "-m autoplan.cli run" in slurm


def test_the_torchx_component_renders_a_kubernetes_job(tmp_path):
    pytest.importorskip("torchx", reason="torchx is optional: pip install torchx==0.7.0")
    pytest.importorskip("kubernetes", reason="TorchX's Kubernetes scheduler needs: pip install torchx[kubernetes]")
    from torchx.runner import get_runner

    request = get_runner().dryrun_component(f"{_component(tmp_path)}:train", [], "kubernetes", cfg={"queue": "q"})
    job = yaml.safe_load(str(request.request))
    assert job["kind"] == "Job" and len(job["spec"]["tasks"]) == 2


# ---- the command ----------------------------------------------------------------------------------


@pytest.fixture
def plan_dir(tmp_path, monkeypatch):
    """A working folder with gpt.py and a 16-device dgx-h100 plan; ../outside.py lies outside it."""
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    shutil.copy(Path(__file__).resolve().parents[3] / "examples/gpt.py", work / "gpt.py")
    shutil.copy(work / "gpt.py", tmp_path / "outside.py")
    Plan(devices=16, dp=16, tp=1, pp=1, micro_batch_size=1, num_microbatches=1, profile="dgx-h100").save("plan.json")
    return work


def test_launch_writes_the_script_and_prints_the_submit_command(plan_dir, capsys):
    assert main(["launch", "gpt.py", "plan.json", "--slurm", "--steps", "5"]) == 0
    assert "submit with: sbatch launch.sbatch" in capsys.readouterr().out
    options = sbatch_options((plan_dir / "launch.sbatch").read_text())
    assert options["--nodes"] == "2" and options["--gpus-per-node"] == "8"  # dgx-h100: 8 per node
    assert main(["launch", "gpt.py", "plan.json", "--skypilot", "--out", "s.yaml"]) == 0
    task = yaml.safe_load((plan_dir / "s.yaml").read_text())
    assert task["resources"]["accelerators"] == "H100:8" and "--plan plan.json" in task["run"]


@pytest.mark.parametrize(
    ("argv", "sentence"),
    [
        (["gpt.py", "plan.json"], "give exactly one of --slurm, --skypilot and --torchx, not 0."),
        (["gpt.py", "plan.json", "--slurm", "--skypilot"], "not 2."),
        (["gpt.py", "none.json", "--slurm"], "plan 'none.json' is neither a plan.json nor a plan folder"),
        (["none.py", "plan.json", "--slurm"], "model file 'none.py' does not exist"),
        (["gpt.py", "plan.json", "--slurm", "--gpus-per-node", "3"], "not whole nodes of 3"),
        (["gpt.py", "plan.json", "--slurm", "--time", "soon"], "--time 'soon'"),
        (["../outside.py", "plan.json", "--skypilot"], "file '../outside.py' is outside this folder"),
    ],
)
def test_bad_input_is_one_sentence_and_exit_2(plan_dir, capsys, argv, sentence):
    assert main(["launch", *argv]) == 2
    err = capsys.readouterr().err
    assert sentence in err and err.count("\n") == 1, err


def test_a_plan_without_a_readable_profile_needs_gpus_per_node(plan_dir, capsys):
    Plan(devices=4, dp=4, tp=1, pp=1, micro_batch_size=1, num_microbatches=1, profile="no-such").save("p.json")
    assert main(["launch", "gpt.py", "p.json", "--slurm"]) == 2
    assert "pass --gpus-per-node G." in capsys.readouterr().err
    assert main(["launch", "gpt.py", "p.json", "--slurm", "--gpus-per-node", "4"]) == 0
