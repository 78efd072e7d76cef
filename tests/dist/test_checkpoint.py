"""Checkpoints on real gloo ranks through the CLI: a crash recovered by --max-restarts ends with
the same losses as a run without one (bit-identical: the run is deterministic); restarts run
out with one sentence; a stop signal writes a final checkpoint that --resume continues; a
checkpoint of dp=2 x tp=2 on 4 ranks reshards into the plan `autoplan replan` picks for 2; and a
torchrun job that loses one of its two nodes re-plans for the survivor (--elastic)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from exec_harness import cli_here

from autoplan.execute.checkpoint import store
from autoplan.types.plan import Plan

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
MODEL = """
import os, time, torch

class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(8, 16)
        self.drop = torch.nn.Dropout(0.1)   # random: resumed runs must restore the data and RNG position
        self.b = torch.nn.Linear(16, 8)

    def forward(self, x):
        time.sleep(float(os.environ.get("STEP_SLEEP_S", "0")))
        return self.b(self.drop(torch.relu(self.a(x))))

def build_model():
    return Net()

def example_inputs(batch_size):
    return (torch.randn(batch_size, 8),)
"""
GPT_ENV = {
    "AUTOPLAN_GPT_N_LAYER": "4",
    "AUTOPLAN_GPT_N_EMBD": "64",
    "AUTOPLAN_GPT_N_HEAD": "4",
    "AUTOPLAN_GPT_VOCAB_SIZE": "256",
    "AUTOPLAN_GPT_BLOCK_SIZE": "32",
}


def _autoplan(*args, env=None, timeout=240) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "autoplan.cli", *map(str, args)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=dict(os.environ, **(env or {})),
    )


def _model(tmp_path: Path) -> Path:
    path = tmp_path / "model.py"
    path.write_text(MODEL)
    return path


def _plan(tmp_path: Path, name: str = "plan.json", **kw) -> Path:
    kw = {"devices": 2, "dp": 2, "tp": 1, "pp": 1, "zero_stage": 1, "micro_batch_size": 2, "num_microbatches": 2, **kw}
    return Plan(**kw).save(tmp_path / name)


def _losses(run: Path) -> list[str]:
    lines = (run / "measured.csv").read_text().splitlines()[1:]
    return [line.split(",")[2] for line in lines]


def _final_loss(run: Path) -> float:
    return json.loads((run / "summary.json").read_text())["final_loss"]


def _said(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("autoplan:")]


def test_a_crash_or_a_stop_signal_loses_no_work_and_changes_no_loss(tmp_path):
    """A rank that dies is restarted from the last checkpoint (--max-restarts); SIGTERM writes a
    final checkpoint that --resume continues; both end with the losses of a run that had neither,
    bit for bit (the run is deterministic, dropout included)."""
    model, plan, steps = _model(tmp_path), _plan(tmp_path), 10
    ref = _autoplan("run", model, "--plan", plan, "--steps", steps, "--out", tmp_path / "ref")
    assert ref.returncode == 0, ref.stderr[-3000:]
    hurt = _autoplan(
        "run",
        model,
        "--plan",
        plan,
        "--steps",
        steps,
        "--out",
        tmp_path / "hurt",
        "--checkpoint-dir",
        tmp_path / "ck",
        "--checkpoint-every",
        2,
        "--max-restarts",
        1,
        env={"AUTOPLAN_INJECT_FAULT": "1:3"},
    )
    assert hurt.returncode == 0, hurt.stderr[-3000:]
    assert "injected fault: rank 1 exits before step 3" in hurt.stderr
    assert "resumed from" in hurt.stdout and "step-00000002 at step 2 of 10" in hurt.stdout
    assert _losses(tmp_path / "hurt") == _losses(tmp_path / "ref")
    assert _final_loss(tmp_path / "hurt") == _final_loss(tmp_path / "ref")  # bit-identical
    assert sorted(p.name for p in (tmp_path / "ck").glob("step-*")) == ["step-00000008", "step-00000010"]
    _stop_and_resume(tmp_path, model=model, plan=plan, steps=steps)


def test_restarts_that_run_out_stop_with_one_sentence(tmp_path):
    model, plan = _model(tmp_path), _plan(tmp_path)
    proc = _autoplan(
        "run",
        model,
        "--plan",
        plan,
        "--steps",
        4,
        "--out",
        tmp_path / "run",
        "--checkpoint-dir",
        tmp_path / "ck",
        "--checkpoint-every",
        1,
        "--max-restarts",
        1,
        env={"AUTOPLAN_INJECT_FAULT": "1:2:9"},
    )
    errors = [line for line in _said(proc.stderr) if "error" in line]
    assert proc.returncode == 2 and len(errors) == 1, proc.stderr[-3000:]
    assert "the job failed 2 times (--max-restarts 1)" in errors[0] and "rank 1 failed (exit code 75)" in errors[0]
    assert f"--resume {tmp_path / 'ck'}" in errors[0]


def _stop_and_resume(tmp_path: Path, *, model: Path, plan: Path, steps: int) -> None:
    ck = tmp_path / "stop"
    env = dict(os.environ, STEP_SLEEP_S="0.15")
    cmd = [
        sys.executable,
        "-m",
        "autoplan.cli",
        "run",
        str(model),
        "--plan",
        str(plan),
        "--out",
        str(tmp_path / "a"),
        "--steps",
        "1000",
        "--checkpoint-dir",
        str(ck),
        "--checkpoint-every",
        "3",
    ]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for _ in range(600):
        if (ck / "latest").is_file() or proc.poll() is not None:
            break
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=90)
    assert proc.returncode == 143, stderr[-3000:]
    assert _said(stderr)[-1] == (
        f"autoplan: stopped by SIGTERM: all 2 ranks were ended; the last checkpoint is in {ck}: "
        f"continue with --resume {ck}."
    )
    stopped_at = int((ck / "latest").read_text().strip().split("-")[1])
    assert stopped_at >= 3 and len(_losses(tmp_path / "a")) == stopped_at  # the final one, not only the periodic
    assert stopped_at < steps, "the stop came too late to test a resume"
    resumed = _autoplan(
        "run",
        model,
        "--plan",
        plan,
        "--out",
        tmp_path / "b",
        "--steps",
        steps,
        "--resume",
        ck,
        env={"STEP_SLEEP_S": "0"},
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert _losses(tmp_path / "b") == _losses(tmp_path / "ref")


def _cpu_profile(tmp_path: Path, devices: int) -> Path:
    text = (ROOT / "profiles/cpu-gloo.yaml").read_text().replace("devices_per_node: 2", f"devices_per_node: {devices}")
    path = tmp_path / "cpu4.yaml"
    path.write_text(text)
    return path


def test_a_tp_checkpoint_reshards_into_the_plan_replan_picks_for_fewer_devices(tmp_path):
    gpt, profile = ROOT / "examples/gpt.py", _cpu_profile(tmp_path, 4)
    made = cli_here(
        "plan",
        gpt,
        "--devices",
        4,
        "--profile",
        profile,
        "--batch",
        8,
        "--fix",
        "dp=2,tp=2,pp=1",
        "--out",
        tmp_path / "p4",
        env=GPT_ENV,
    )
    assert made.returncode == 0, made.stderr[-3000:]
    first = _autoplan(
        "run",
        gpt,
        "--plan",
        tmp_path / "p4/plan.json",
        "--steps",
        6,
        "--out",
        tmp_path / "r4",
        "--checkpoint-dir",
        tmp_path / "ck",
        "--checkpoint-every",
        3,
        env=GPT_ENV,
    )
    assert first.returncode == 0, first.stderr[-3000:]
    replanned = cli_here("replan", tmp_path / "ck/step-00000003", "--devices", 2, "--out", tmp_path / "p2", env=GPT_ENV)
    assert replanned.returncode == 0, replanned.stderr[-3000:]
    plan2 = Plan.load(tmp_path / "p2/plan.json")
    assert plan2.devices == 2 and plan2.global_batch_size == 8 and plan2.tp == 1
    resumed = _autoplan(
        "run",
        gpt,
        "--plan",
        tmp_path / "p2/plan.json",
        "--steps",
        6,
        "--out",
        tmp_path / "r2",
        "--resume",
        tmp_path / "ck/step-00000003",
        env=GPT_ENV,
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    # The same batches on another layout: the losses go on as the 4-rank run's did, up to rounding.
    got, want = _losses(tmp_path / "r2"), _losses(tmp_path / "r4")
    assert got[:3] == want[:3] and _close(got[3:], want[3:]), (got, want)


def test_a_torchrun_job_that_loses_a_node_replans_for_the_survivor(tmp_path):
    """Two local torchrun "nodes" of one rank each (--nnodes 1:2); node B is killed with its
    rank; node A's agent restarts with one rank, which re-plans (--elastic) and resumes. Node A
    hosts the rendezvous store (``is_host``): left to whichever agent binds the port first, a
    loaded machine let B host it now and then, and killing B then took A's store with it.

    Nothing waits on time alone. On a loaded machine A may form round 0 alone (a quorum of one after
    last_call_timeout) and B join round 1; under torch 2.13's shared store B then waits forever for the
    store address rank 0 published only in round 0, so the agents do not share it (docs/elastic.md). B is
    killed once a checkpoint written by both ranks exists, and joins and store reads may take 300 s."""
    model, profile = _model(tmp_path), _cpu_profile(tmp_path, 2)
    made = cli_here(
        "plan", model, "--devices", 2, "--profile", profile, "--batch", 4, "--fix", "dp=2", "--out", tmp_path / "p"
    )
    assert made.returncode == 0, made.stderr[-3000:]
    ck, port = tmp_path / "ck", _free_port()
    node = [
        "torchrun",
        "--nnodes=1:2",
        "--nproc-per-node=1",
        "--max-restarts=2",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint=127.0.0.1:{port}",
        "--rdzv-id=test",
        "--rdzv-conf=last_call_timeout=2,join_timeout=300,read_timeout=300,is_host={host}",
        "-m",
        "autoplan.cli",
        "run",
        str(model),
        "--plan",
        str(tmp_path / "p/plan.json"),
        "--steps",
        "24",
        "--out",
        str(tmp_path / "run"),
        "--checkpoint-dir",
        str(ck),
        "--checkpoint-every",
        "2",
        "--elastic",
    ]
    env = dict(os.environ, STEP_SLEEP_S="0.1", TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1")  # docs/elastic.md
    node_a, node_b = ([arg.format(host=host) for arg in node] for host in (1, 0))
    a = subprocess.Popen(node_a, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    b = subprocess.Popen(
        node_b, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    for _ in range(1800):
        if _world_size_of_latest(ck) == 2 or a.poll() is not None:
            break
        time.sleep(0.1)
    assert a.poll() is None, "node A ended before both nodes wrote a checkpoint: " + a.communicate()[1][-3000:]
    os.killpg(b.pid, signal.SIGKILL)  # node B is lost: its agent and its rank
    b.wait()
    out, err = a.communicate(timeout=240)
    assert a.returncode == 0, err[-3000:]
    assert "--elastic: 1 ranks, not 2; re-planned: dp=1" in out
    assert "resumed from" in out
    assert len(_losses(tmp_path / "run")) == 24


def _world_size_of_latest(ck: Path) -> int:
    """The world size recorded by the newest complete checkpoint in ``ck`` (0 while there is none)."""
    from autoplan.errors import CheckpointError
    from autoplan.execute.checkpoint.store import find_checkpoint, read_info

    try:
        return read_info(find_checkpoint(ck)).world_size
    except CheckpointError:
        return 0


def _free_port() -> int:
    from autoplan.jobs.launcher import free_port

    return free_port()


MOE_ENV = {"AUTOPLAN_MOE_DIM": "32", "AUTOPLAN_MOE_VOCAB": "128", "AUTOPLAN_MOE_SEQ": "16"}


def test_expert_parallel_checkpoints_reshard_between_zero_stages(tmp_path):
    """Experts sliced over ep (and, under ZeRO-3, sharded again over edp by FSDP2) are saved as
    whole [E, ...] tensors: a ZeRO-3 checkpoint, written in the background, continues under ZeRO-1
    as the ZeRO-3 run itself went on (fp32: the same sums, in another order)."""
    moe, kw = ROOT / "examples/moe.py", {"ep": 2, "micro_batch_size": 4, "num_microbatches": 1}
    zero3, zero1 = _plan(tmp_path, "z3.json", zero_stage=3, **kw), _plan(tmp_path, "z1.json", zero_stage=1, **kw)
    first = _autoplan(
        "run",
        moe,
        "--plan",
        zero3,
        "--steps",
        4,
        "--out",
        tmp_path / "a",
        "--checkpoint-dir",
        tmp_path / "ck",
        "--checkpoint-every",
        2,
        "--async-checkpoint",
        env=MOE_ENV,
    )
    resumed = _autoplan(
        "run",
        moe,
        "--plan",
        zero1,
        "--steps",
        4,
        "--out",
        tmp_path / "b",
        "--resume",
        tmp_path / "ck/step-00000002",
        env=MOE_ENV,
    )
    assert first.returncode == resumed.returncode == 0, first.stderr[-2000:] + resumed.stderr[-2000:]
    got, want = _losses(tmp_path / "b"), _losses(tmp_path / "a")
    assert got[:2] == want[:2] and _close(got[2:], want[2:]), (got, want)


def _close(got: list[str], want: list[str], rtol: float = 1e-5) -> bool:
    return len(got) == len(want) and all(abs(float(a) - float(b)) <= rtol * abs(float(b)) for a, b in zip(got, want))


def test_experts_folded_over_tp_checkpoint_as_whole_tensors_and_resume_at_tp_1(tmp_path):
    """Experts folded over tp ranks (tp=2, ep=2: Shard(0) DTensors on the ep mesh) are saved as whole [E, ...]
    tensors: the checkpoint continues at dp=2 x ep=2 as the folded run itself went on (fp32)."""
    moe, batch = ROOT / "examples/moe.py", {"ep": 2, "zero_stage": 0, "num_microbatches": 1}
    folded = _plan(tmp_path, "folded.json", dp=1, tp=2, sequence_parallel=True, micro_batch_size=4, **batch)
    flat = _plan(tmp_path, "flat.json", micro_batch_size=2, **batch)
    first = _autoplan("run", moe, "--plan", folded, "--steps", 4, "--out", tmp_path / "a", "--checkpoint-dir",
                      tmp_path / "ck", "--checkpoint-every", 2, env=MOE_ENV)  # fmt: skip
    resumed = _autoplan("run", moe, "--plan", flat, "--steps", 4, "--out", tmp_path / "b", "--resume",
                        tmp_path / "ck/step-00000002", env=MOE_ENV)  # fmt: skip
    assert first.returncode == resumed.returncode == 0, first.stderr[-2000:] + resumed.stderr[-2000:]
    got, want = _losses(tmp_path / "b"), _losses(tmp_path / "a")
    assert got[:2] == want[:2] and _close(got[2:], want[2:]), (got, want)


@pytest.mark.parametrize("zero", [0, 3])
def test_a_resume_continues_with_each_dp_ranks_buffers_persistent_or_not(tmp_path, zero):
    """tests/odd_models/buffer_updates.py (spectral-norm vectors, a non-persistent running mean its forward reads)
    and BatchNorm statistics differ per dp rank; a resume lost the running mean and, under DDP, started from the
    rank DCP let write the statistics: its losses moved 1e-4 to 5e-2 (checkpoint/buffers.py). Stopped after step 2
    and resumed, it ends with the losses of a run that was not."""
    model, steps = ROOT / "tests/odd_models/buffer_updates.py", 4
    plan = _plan(tmp_path, zero_stage=zero, micro_batch_size=4, num_microbatches=1)
    ref = _autoplan("run", model, "--plan", plan, "--steps", steps, "--out", tmp_path / "ref")
    assert ref.returncode == 0, ref.stderr[-3000:]
    first = _autoplan(
        "run", model, "--plan", plan, "--steps", 2, "--out", tmp_path / "r", "--checkpoint-dir", tmp_path / "ck"
    )
    assert first.returncode == 0, first.stderr[-3000:]
    again = _autoplan(
        "run", model, "--plan", plan, "--steps", steps, "--out", tmp_path / "r", "--resume", tmp_path / "ck"
    )
    assert again.returncode == 0, again.stderr[-3000:]
    assert "resumed from" in again.stdout
    assert _losses(tmp_path / "r") == _losses(tmp_path / "ref")
    held = store.read_dcp_metadata(tmp_path / "ck" / "step-00000002").state_dict_metadata
    second = {k for k in held if k.startswith("extra.buffers.dp1.")}  # dp index 1's: only where it differs from 0's
    assert "extra.buffers.dp0.center.mean" in held and bool(second) == (zero == 3)  # none under DDP


UNUSED = """
import torch

class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.mask_token = torch.nn.Parameter(torch.zeros(16))  # as DINOv2's: read only when a mask is passed
        self.blocks = torch.nn.ModuleList(torch.nn.Linear(16, 16) for _ in range(4))
        self.head = torch.nn.Linear(16, 4)

    def forward(self, x):
        for block in self.blocks:
            x = x + torch.tanh(block(x))
        return self.head(x)

def build_model():
    return Net()

def example_inputs(batch_size):
    return (torch.randn(batch_size, 16),)
"""


@pytest.mark.parametrize("fix", ["dp=2,zero=3", "pp=2,schedule=1f1b"])
def test_a_model_with_a_parameter_its_forward_never_reads_resumes(tmp_path, fix):
    """AdamW keeps no state for a parameter that never gets a gradient, and a pipeline's stages hold no parameter
    the graph never reads: the checkpoint autoplan wrote was then refused as "written for another model" (HF
    DINOv2's mask_token on every plan). Stopped after step 2 and resumed, the run ends as one that was not."""
    model = tmp_path / "unused.py"
    model.write_text(UNUSED)
    planned = cli_here("plan", model, "--profile", "cpu-gloo", "--devices", 2, "--batch", 8, "--fix", fix,
                       "--out", tmp_path / "plan", "--quiet")  # fmt: skip  # in this process: no start-up
    assert planned.returncode == 0, planned.stderr[-3000:]
    plan = tmp_path / "plan" / "plan.json"
    ref = _autoplan("run", model, "--plan", plan, "--steps", 3, "--out", tmp_path / "ref")
    first = _autoplan("run", model, "--plan", plan, "--steps", 2, "--out", tmp_path / "r", "--checkpoint-dir",
                      tmp_path / "ck", "--checkpoint-every", 2)  # fmt: skip
    again = _autoplan("run", model, "--plan", plan, "--steps", 3, "--out", tmp_path / "r", "--resume", tmp_path / "ck")
    assert ref.returncode == first.returncode == again.returncode == 0, again.stderr[-3000:]
    assert "resumed from" in again.stdout
    assert _losses(tmp_path / "r") == _losses(tmp_path / "ref")
    assert "model.mask_token" in store.read_dcp_metadata(tmp_path / "ck" / "step-00000002").state_dict_metadata
