"""How cloud nodes get autoplan and keep checkpoints: SkyPilot's setup installs this checkout (synced
in the workdir or copied by ``file_mounts``), never ``pip install autoplan`` (an unrelated project on
PyPI); a TorchX job with restarts mounts a shared checkpoint volume, rendered by TorchX itself."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from autoplan.cli import main
from autoplan.errors import RunError
from autoplan.jobs.install import DISTRIBUTION, NODE_CHECKOUT, checkout_root, node_install
from autoplan.types.plan import Plan

ROOT = Path(__file__).resolve().parents[3]


def test_the_checkout_is_this_project_under_a_free_distribution_name():
    assert checkout_root() == ROOT and DISTRIBUTION == "torch-autoplan"
    assert re.search(rf'^name = "{DISTRIBUTION}"$', (ROOT / "pyproject.toml").read_text(), flags=re.MULTILINE)


@pytest.mark.parametrize(
    ("workdir", "setup", "mounts"),
    [
        ("checkout", "pip install -c ./constraints.txt -e .", {}),
        ("above", "pip install -c src/autoplan/constraints.txt -e src/autoplan", {}),
        ("elsewhere", f"pip install -c {NODE_CHECKOUT}/constraints.txt -e {NODE_CHECKOUT}", "checkout"),
    ],
)
def test_nodes_install_the_checkout_from_the_workdir_or_a_file_mount(tmp_path, workdir, setup, mounts):
    checkout = tmp_path / "src/autoplan"
    checkout.mkdir(parents=True)
    folders = {"checkout": checkout, "above": tmp_path, "elsewhere": tmp_path / "job"}
    folders["elsewhere"].mkdir()
    install = node_install(checkout=checkout, workdir=folders[workdir])
    assert install.setup == setup and "autoplan==" not in install.setup
    assert install.file_mounts == ({NODE_CHECKOUT: str(checkout)} if mounts else {})
    assert subprocess.run(["bash", "-n", "-c", install.setup]).returncode == 0


def test_an_installed_wheel_needs_setup():
    with pytest.raises(RunError, match="not a checkout, and torch-autoplan is not on PyPI; pass --setup"):
        node_install(checkout=None, workdir=Path.cwd())


@pytest.fixture
def work(tmp_path, monkeypatch):
    """A job folder outside the checkout with mlp.py and a 4-device plan (2 nodes of 2)."""
    monkeypatch.chdir(tmp_path)
    shutil.copy(ROOT / "examples/mlp.py", tmp_path / "mlp.py")
    Plan(devices=4, dp=4, tp=1, pp=1, micro_batch_size=1, num_microbatches=1, profile="dgx-h100").save("plan.json")
    return tmp_path


def test_the_skypilot_task_copies_and_installs_this_checkout(work):
    assert main(["launch", "mlp.py", "plan.json", "--skypilot", "--gpus-per-node", "2"]) == 0
    task = yaml.safe_load((work / "sky.yaml").read_text())
    assert task["file_mounts"] == {NODE_CHECKOUT: str(ROOT)}
    assert task["setup"].strip() == f"pip install -c {NODE_CHECKOUT}/constraints.txt -e {NODE_CHECKOUT}"
    assert (
        main(["launch", "mlp.py", "plan.json", "--skypilot", "--gpus-per-node", "2", "--setup", "uv pip install x"])
        == 0
    )
    task = yaml.safe_load((work / "sky.yaml").read_text())
    assert task["setup"].strip() == "uv pip install x" and "file_mounts" not in task


def _torchx(*extra: str) -> list[str]:
    return ["launch", "mlp.py", "plan.json", "--torchx", "--gpus-per-node", "2", *extra]


@pytest.mark.parametrize(
    ("extra", "sentence"),
    [
        ((), "TorchX's 3 restart(s) resume only from checkpoints every replica can read; pass --checkpoint-volume"),
        (("--max-retries", "-1"), "--max-retries -1: expected 0 or more"),
        (("--checkpoint-volume", "c", "--checkpoint-dir", "ck"), "with --checkpoint-volume the checkpoint folder is"),
    ],
)
def test_torchx_restarts_need_a_shared_volume(work, capsys, extra, sentence):
    assert main(_torchx(*extra)) == 2
    err = capsys.readouterr().err
    assert sentence in err and err.count("\n") == 1, err


def test_a_checkpoint_volume_is_torchx_only(work, capsys):
    assert main(["launch", "mlp.py", "plan.json", "--slurm", "--checkpoint-volume", "c"]) == 2
    assert "--checkpoint-volume is for --torchx" in capsys.readouterr().err


def _kubernetes_pod(component: Path, *args: str) -> dict:
    pytest.importorskip("torchx", reason="torchx is optional: pip install torchx==0.7.0")
    pytest.importorskip("kubernetes", reason="TorchX's Kubernetes scheduler needs: pip install torchx[kubernetes]")
    from torchx.runner import get_runner

    request = get_runner().dryrun_component(f"{component}:train", list(args), "kubernetes", cfg={"queue": "q"})
    job = yaml.safe_load(str(request.request))
    assert job["spec"]["maxRetry"] == 3 and len(job["spec"]["tasks"]) == 2
    return job["spec"]["tasks"][0]["template"]["spec"]


@pytest.mark.filterwarnings("ignore::UserWarning:torchx.schedulers.kubernetes_scheduler")  # Volcano and retries
def test_every_replica_mounts_the_volume_and_checkpoints_into_it(work):
    assert main(_torchx("--checkpoint-volume", "ckpt-claim")) == 0
    pod = _kubernetes_pod(work / "torchx_job.py")
    assert {"name": "mount-0", "persistentVolumeClaim": {"claimName": "ckpt-claim"}} in pod["volumes"]
    container = pod["containers"][0]
    assert {"mountPath": "/checkpoints", "name": "mount-0", "readOnly": False} in container["volumeMounts"]
    assert "--checkpoint-dir /checkpoints" in container["command"][-1]
    host = _kubernetes_pod(work / "torchx_job.py", "--checkpoint_volume", "/mnt/nfs/ck")  # a host path: bind
    assert {"name": "mount-0", "hostPath": {"path": "/mnt/nfs/ck"}} in host["volumes"]
    with pytest.raises(ValueError, match="resumes only from a shared checkpoint volume"):
        _kubernetes_pod(work / "torchx_job.py", "--checkpoint_volume", "")


def test_no_retries_need_no_volume(work):
    assert main(_torchx("--max-retries", "0")) == 0
    assert "max_retries: int = 0" in (work / "torchx_job.py").read_text()
