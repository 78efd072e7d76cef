"""Run a plan for real with torch.distributed: mesh, PP split, TP (+SP), recomputation,
FSDP2/DDP, schedule (see docs/executor.md).

``parallelize(model, plan, loss_fn=...)`` inside an initialised process group returns a
:class:`~autoplan.execute.trainer.Trainer` with ``train_step(inputs, target)``, ``.model``
and ``.optimizer``. ``autoplan run`` launches it (autoplan/cli/execute.py).
"""

from __future__ import annotations

from typing import Any

__all__ = ["parallelize", "Trainer"]


def __getattr__(name: str) -> Any:  # lazy: importing autoplan.execute stays cheap
    if name == "parallelize":
        from autoplan.execute.api import parallelize

        return parallelize
    if name == "Trainer":
        from autoplan.execute.trainer import Trainer

        return Trainer
    raise AttributeError(f"module 'autoplan.execute' has no attribute '{name}'")
