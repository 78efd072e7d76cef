"""Checkpoints from the Python API (autoplan.checkpointer / autoplan.resume) around parallelize:
a ZeRO-1 trainer's checkpoint loads into a ZeRO-3 (FSDP2) trainer of the same model, which then
takes the same step the ZeRO-1 trainer takes."""
from __future__ import annotations

import os
from datetime import timedelta

import pytest

from autoplan.jobs.spawn import report, spawn_ranks

pytestmark = pytest.mark.slow


def _worker(rank, world, port, folder, messages):
    report(messages, rank, lambda: _train_save_resume(rank, world, port, folder))


def _train_save_resume(rank, world, port, folder):
    import torch
    import torch.distributed as dist

    import autoplan
    from autoplan.types.plan import Plan

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=60))

    def trainer(zero):
        torch.manual_seed(zero)  # other initial weights: the checkpoint must replace them
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
        plan = Plan(devices=2, dp=2, tp=1, pp=1, zero_stage=zero, micro_batch_size=2, num_microbatches=1)
        return autoplan.parallelize(model, plan, loss_fn=lambda out, y: ((out - y) ** 2).mean())

    torch.manual_seed(7)
    batches = [(torch.randn(4, 8), torch.randn(4, 4)) for _ in range(3)]
    first = trainer(1)
    saver = autoplan.checkpointer(first, folder)
    assert autoplan.resume(first, folder, saver) is None  # nothing saved yet
    for x, y in batches[:2]:
        first.train_step(*first.local_batch((x,), y))
    saver.save(first, steps_done=2, rows=[])
    second = trainer(3)
    info = autoplan.resume(second, folder, autoplan.checkpointer(second, folder))
    x, y = batches[2]
    losses = [t.reduce_loss(t.train_step(*t.local_batch((x,), y))) for t in (first, second)]
    dist.destroy_process_group()
    return info.step, losses


def test_a_zero1_checkpoint_resumes_a_zero3_trainer_from_the_api(tmp_path):
    results = spawn_ranks(_worker, processes=2, args=(str(tmp_path / "ck"),), timeout_s=180, what="checkpointing")
    step, (zero1_loss, zero3_loss) = results[0]
    assert step == 2
    assert abs(zero3_loss - zero1_loss) <= 1e-6 * abs(zero1_loss), (zero1_loss, zero3_loss)
