"""The Python API on two real gloo ranks, spawned once for both checks:

- checkpoints (autoplan.checkpointer / autoplan.resume) around parallelize: a ZeRO-1 trainer's
  checkpoint loads into a ZeRO-3 (FSDP2) trainer of the same model, which then takes the same
  step the ZeRO-1 trainer takes;
- DiLoCo's outer state (execute/checkpoint/outer.py): a checkpoint right after an outer sync resumes the
  anchor, the Nesterov momentum and the step count, so the next sync of the resumed trainer writes the same
  parameters as the uninterrupted one's (inner SGD without state: nothing else is per replica);
- the README's example, call for call: ``autoplan.plan(model, inputs, ...)`` picks pp=2 for a
  4-block MLP on 2 CPU ranks, and ``autoplan.parallelize(model, plan, loss_fn=...)`` runs it with no
  micro-batch given (the plan keeps its inputs' shapes and dtypes); ``train_step`` returns NaN on
  the rank without the last stage, and ``reduce_loss`` the loss on both."""

from __future__ import annotations

import math
import os
import traceback
from datetime import timedelta

import pytest

from autoplan.jobs.spawn import report, spawn_ranks

pytestmark = pytest.mark.slow


def _worker(rank, world, port, folder, messages):
    report(messages, rank, lambda: _both(rank, world, port, folder))


def _both(rank, world, port, folder):
    import torch
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=60))
    results = {
        "checkpoint": _train_save_resume(folder),
        "diloco": _caught(lambda: _diloco_save_resume(folder + "-diloco")),
        "readme": _caught(_readme_example),
    }
    dist.destroy_process_group()
    return results


def _caught(check):
    """``check()``, or its traceback: one failing check leaves the other's result standing."""
    try:
        return check()
    except Exception:
        return {"error": traceback.format_exc()}


def _readme_example():
    """README.md's "From Python" example with a 4-block MLP on the cpu-gloo profile."""
    import torch

    import autoplan

    class Block(torch.nn.Module):
        def __init__(self, width):
            super().__init__()
            self.up, self.down = torch.nn.Linear(width, 4 * width), torch.nn.Linear(4 * width, width)

        def forward(self, x):
            return x + self.down(torch.relu(self.up(x)))

    class MLP(torch.nn.Module):
        def __init__(self, width=256, blocks=4):
            super().__init__()
            self.blocks = torch.nn.ModuleList(Block(width) for _ in range(blocks))
            self.head = torch.nn.Linear(width, 1)

        def forward(self, x):
            for block in self.blocks:
                x = block(x)
            return self.head(x)

    torch.manual_seed(0)  # the same weights on every rank
    model, example_inputs = MLP(), (torch.randn(8, 256),)
    inputs, target = (torch.randn(8, 256),), torch.randn(8, 1)

    def loss_fn(out, y):
        return ((out - y) ** 2).mean()

    plan = autoplan.plan(model, example_inputs, devices=2, profile="cpu-gloo", batch_size=8)
    trainer = autoplan.parallelize(model, plan, loss_fn=loss_fn)
    loss = trainer.train_step(*trainer.local_batch(inputs, target))
    return {
        "pp": plan.pp,
        "last_stage": trainer.holds_last_stage,
        "loss": float(loss),
        "global": trainer.reduce_loss(loss),
    }


def _train_save_resume(folder):
    import torch

    import autoplan
    from autoplan.types.plan import Plan

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
    return info.step, losses


def _diloco_save_resume(folder):
    """4 steps of DiLoCo every 2 (syncs after steps 2 and 4), a checkpoint, a trainer of other weights resumed
    from it; both take 3 more steps (a sync after the second): the steps counted, the largest difference of
    their anchors and of their weights after them, and their last losses."""
    import torch

    import autoplan
    from autoplan.types.plan import Plan

    def trainer(seed):
        torch.manual_seed(seed)
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
        plan = Plan(
            devices=2, dp=2, tp=1, pp=1, micro_batch_size=2, num_microbatches=1, sync_every=2,
            outer_optimizer="nesterov",
        )  # fmt: skip
        sgd = lambda params: torch.optim.SGD(params, lr=0.1)  # noqa: E731 (no per-replica state)
        return autoplan.parallelize(model, plan, loss_fn=lambda out, y: ((out - y) ** 2).mean(), optimizer_fn=sgd)

    torch.manual_seed(11)
    batches = [(torch.randn(4, 8), torch.randn(4, 4)) for _ in range(7)]
    first = trainer(0)
    for x, y in batches[:4]:
        first.train_step(*first.local_batch((x,), y))
    autoplan.checkpointer(first, folder).save(first, steps_done=4, rows=[])
    second = trainer(5)
    autoplan.resume(second, folder, autoplan.checkpointer(second, folder))
    losses = [[t.reduce_loss(t.train_step(*t.local_batch((x,), y))) for x, y in batches[4:]] for t in (first, second)]
    anchors = max(float((a - b).abs().max()) for a, b in zip(first.outer.anchors, second.outer.anchors))
    weights = max(float((a - b).abs().max()) for a, b in zip(first.model.parameters(), second.model.parameters()))
    return {"steps": [first.outer.steps, second.outer.steps], "anchors": anchors, "weights": weights, "losses": losses}


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    folder = tmp_path_factory.mktemp("api") / "ck"
    return spawn_ranks(_worker, processes=2, args=(str(folder),), timeout_s=240, what="running the Python API")


def test_a_zero1_checkpoint_resumes_a_zero3_trainer_from_the_api(ranks):
    step, (zero1_loss, zero3_loss) = ranks[0]["checkpoint"]
    assert step == 2
    assert abs(zero3_loss - zero1_loss) <= 1e-6 * abs(zero1_loss), (zero1_loss, zero3_loss)


def test_a_diloco_checkpoint_resumes_its_anchor_momentum_and_step_count(ranks):
    for rank in (0, 1):
        found = ranks[rank]["diloco"]
        assert "error" not in found, found.get("error")
        assert found["steps"] == [7, 7]
        assert found["anchors"] == 0.0 and found["weights"] == 0.0, found
        assert found["losses"][0] == found["losses"][1]


def test_the_readme_example_runs_a_pipelined_plan_without_a_microbatch(ranks):
    assert not any("error" in ranks[r]["readme"] for r in (0, 1)), [ranks[r]["readme"].get("error") for r in (0, 1)]
    first, last = sorted((ranks[0]["readme"], ranks[1]["readme"]), key=lambda r: r["last_stage"])
    assert first["pp"] == last["pp"] == 2 and not first["last_stage"] and last["last_stage"]
    assert math.isnan(first["loss"]) and math.isfinite(last["loss"]) and last["loss"] > 0
    assert first["global"] == last["global"] == pytest.approx(last["loss"])
