"""Checkpoints on disk without a process group: the layout, `latest`, pruning, and one sentence
(exit 2) for each bad checkpoint `autoplan run --resume` can be given."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp

from autoplan.cli import main
from autoplan.errors import CheckpointError, RunError, StopSignal
from autoplan.execute.checkpoint import store
from autoplan.execute.job import checkpointing
from autoplan.types.plan import Plan

MODEL = """
import torch

def build_model():
    return torch.nn.Sequential(torch.nn.Linear(4, {width}), torch.nn.Linear({width}, 2))

def example_inputs(batch_size):
    return (torch.randn(batch_size, 4),)
"""
PLAN = Plan(devices=2, dp=2, tp=1, pp=1, micro_batch_size=1, num_microbatches=1)


def _model_file(tmp_path: Path, width: int = 8, name: str = "model.py") -> Path:
    path = tmp_path / name
    path.write_text(MODEL.format(width=width))
    return path


def _write(root: Path, step: int, *, width: int = 8, keep: int = 2) -> Path:
    """A checkpoint as the executor writes it, from one process (no process group)."""
    torch.manual_seed(step)
    model = torch.nn.Sequential(torch.nn.Linear(4, width), torch.nn.Linear(width, 2))
    tensors = {f"model.{k}": v for k, v in model.state_dict().items()}
    step_dir = root / store.step_dir_name(step)
    dcp.save(tensors, checkpoint_id=str(step_dir), no_dist=True)
    info = store.CheckpointInfo(
        step=step,
        plan=PLAN.to_dict(),
        model_file="model.py",
        model_sha256="x",
        seed=0,
        world_size=2,
        global_batch_size=2,
    )
    store.finalize(root, step_dir, info, keep=keep)
    return step_dir


def _expected(width: int = 8) -> dict:
    model = torch.nn.Sequential(torch.nn.Linear(4, width), torch.nn.Linear(width, 2))
    return {f"model.{k}": tuple(v.shape) for k, v in model.state_dict().items()}


def test_latest_names_the_newest_complete_checkpoint_and_old_ones_are_pruned(tmp_path):
    for step in (2, 4, 6):
        _write(tmp_path, step)
    assert (tmp_path / "latest").read_text().strip() == "step-00000006"
    assert [p.name for p in store.complete_checkpoints(tmp_path)] == ["step-00000004", "step-00000006"]
    (tmp_path / "step-00000008").mkdir()  # a save cut short: no record, so it does not count
    assert store.find_checkpoint(tmp_path).name == "step-00000006"
    (tmp_path / "latest").unlink()
    assert store.find_checkpoint(tmp_path).name == "step-00000006"
    step_dir, info = store.check(tmp_path / "step-00000004", _expected())
    assert step_dir.name == "step-00000004" and info.step == 4 and Plan.from_dict(info.plan) == PLAN


@pytest.mark.parametrize(
    "damage,words",
    [
        (lambda d: (d / "__0_0.distcp").write_bytes(b"x" * 10), "is cut short (10 of"),
        (lambda d: (d / ".metadata").write_text("garbage"), "has no readable DCP metadata"),
        (lambda d: (d / "autoplan.json").write_text("{"), "is not valid JSON"),
        (lambda d: _edit_info(d, format_version=99), "has format 99"),
        (lambda d: _edit_info(d, plan=None, step=None) or _drop_info_key(d, "step"), "is incomplete (missing step)"),
    ],
    ids=["truncated", "metadata", "record-json", "version", "record-field"],
)
def test_a_damaged_checkpoint_is_named_in_one_sentence(tmp_path, damage, words):
    step_dir = _write(tmp_path, 2)
    damage(step_dir)
    with pytest.raises(CheckpointError, match="checkpoint") as caught:
        store.check(step_dir, _expected())
    assert words in str(caught.value) and "\n" not in str(caught.value)


def _edit_info(step_dir: Path, **fields) -> None:
    data = json.loads((step_dir / "autoplan.json").read_text())
    data.update(fields)
    (step_dir / "autoplan.json").write_text(json.dumps(data))


def _drop_info_key(step_dir: Path, key: str) -> None:
    data = json.loads((step_dir / "autoplan.json").read_text())
    data.pop(key)
    (step_dir / "autoplan.json").write_text(json.dumps(data))


def test_a_checkpoint_of_another_model_names_the_tensor(tmp_path):
    step_dir = _write(tmp_path, 2, width=8)
    with pytest.raises(
        CheckpointError, match=r"holds 'model.0.weight' with shape \[8, 4\], but the model's is \[6, 4\]"
    ):
        store.check(step_dir, _expected(width=6))
    with pytest.raises(CheckpointError, match="has no tensor 'model.2.weight'"):
        store.check(step_dir, {**_expected(), "model.2.weight": (2, 2)})


def _run(tmp_path: Path, model: Path, *extra: str) -> int:
    plan = PLAN.save(tmp_path / "plan.json")
    return main(["run", str(model), "--plan", str(plan), "--out", str(tmp_path / "run"), "--steps", "4", *extra])


@pytest.mark.parametrize(
    "setup,extra,words",
    [
        ("other-model", ("--resume", "{ck}"), "holds 'model.0.weight' with shape [8, 4], but the model's is [6, 4]"),
        ("none", ("--resume", "{ck}/nothing"), "does not exist; check the path given to --resume"),
        ("empty", ("--resume", "{ck}"), "holds no complete checkpoint"),
        ("done", ("--resume", "{ck}"), "is already at step 6; ask for more --steps than 4"),
        ("full", ("--checkpoint-dir", "{ck}"), "is already at step 6; ask for more --steps than 4, or give a new"),
        ("early", ("--resume", "{ck}", "--verify"), "so it cannot follow a resume; run --verify without --resume"),
        ("none", ("--max-restarts", "2"), "need --checkpoint-dir D"),
        ("none", ("--checkpoint-dir", "{ck}", "--checkpoint-every", "0"), "--checkpoint-every 0: expected at least 1"),
    ],
    ids=["other-model", "missing", "empty", "done", "dir-resumed", "verify", "restarts-need-dir", "every"],
)
def test_run_refuses_bad_checkpoint_flags_before_any_rank_starts(tmp_path, capsys, setup, extra, words):
    ck = tmp_path / "ck"
    ck.mkdir()
    if setup in ("other-model", "done", "full", "early"):
        _write(ck, 2 if setup == "early" else 6, width=8)
    model = _model_file(tmp_path, width=6 if setup == "other-model" else 8)
    code = _run(tmp_path, model, *(e.format(ck=ck) for e in extra))
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and words in err[0], err
    assert not (tmp_path / "run").exists()


def test_injected_faults_and_restart_counts_read_from_the_environment(monkeypatch):
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "2")
    assert checkpointing.restart_count() == 2
    monkeypatch.setenv(checkpointing.FAULT_ENV, "one:3")
    with pytest.raises(RunError, match="expected RANK:STEP or RANK:STEP:ATTEMPTS"):
        checkpointing.maybe_inject_fault(3)
    monkeypatch.setenv(checkpointing.FAULT_ENV, "0:3:2")  # attempts 0 and 1 only: this is attempt 2
    monkeypatch.setenv("RANK", "0")
    checkpointing.maybe_inject_fault(3)


def test_a_stop_signal_says_where_to_resume():
    assert str(StopSignal(15, 4, hint="the last checkpoint is in ck: continue with --resume ck")) == (
        "stopped by SIGTERM: all 4 ranks were ended; the last checkpoint is in ck: continue with --resume ck."
    )
