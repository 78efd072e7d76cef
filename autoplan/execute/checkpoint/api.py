"""Checkpoints from the Python API, for a training loop of your own around ``parallelize``.

    trainer = parallelize(model, plan, loss_fn=...)
    checkpoints = checkpointer(trainer, "ckpt/", model_file="model.py", every=100)
    info = resume(trainer, "ckpt/", checkpoints)     # None when there is nothing to resume
    for step in range(info.step if info else 0, steps):
        ...trainer.train_step(x, y)...
        if checkpoints.due(step + 1):
            checkpoints.save(trainer, steps_done=step + 1, rows=[])
    checkpoints.wait()                               # an async save still in flight

Every rank calls each of these (they are collectives). The saved form does not depend on the
plan, so ``resume`` also loads a checkpoint written under another plan (docs/elastic.md).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from autoplan.execute.checkpoint import store
from autoplan.execute.checkpoint.manager import Checkpointer


def checkpointer(
    trainer: Any,
    directory: str | Path,
    *,
    model_file: str | Path | None = None,
    every: int = 0,
    async_save: bool = False,
    keep: int = 2,
    seed: int = 0,
) -> Checkpointer:
    """A :class:`Checkpointer` writing to ``directory`` every ``every`` steps (0: when you call
    ``save``); ``model_file`` is recorded (path and SHA-256) so `autoplan replan` can re-plan."""
    record = {
        "model_file": str(Path(model_file).resolve()) if model_file else "",
        "model_sha256": store.model_sha256(model_file) if model_file else "",
        "seed": seed,
        "global_batch_size": trainer.plan.global_batch_size,
    }
    return Checkpointer(root=directory, every=every, async_save=async_save, keep=keep, record=record)


def resume(trainer: Any, path: str | Path, checkpoints: Checkpointer) -> store.CheckpointInfo | None:
    """Load the newest checkpoint under ``path`` (or the step directory ``path``) into ``trainer``,
    resharding it to the trainer's plan; its record (``.step`` = steps done), or None when
    ``path`` holds no checkpoint yet. CheckpointError when it is corrupt or of another model."""
    path = Path(path)
    if not path.exists() or (
        path.is_dir() and not (path / store.INFO).is_file() and not store.complete_checkpoints(path)
    ):
        return None
    step_dir = store.find_checkpoint(path)
    info = store.read_info(step_dir)
    checkpoints.load(trainer, step_dir, info)
    return info
