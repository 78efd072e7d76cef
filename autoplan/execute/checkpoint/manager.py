"""Saving and loading a running trainer's checkpoints, and stopping on a signal with one.

:class:`Checkpointer` writes ``D/step-N`` every ``every`` steps with torch.distributed.checkpoint
(``dcp.save``, or ``dcp.async_save`` with ``async_save``: the state is staged to host memory and
written by a background thread while training goes on; the next save, or the end of the run,
waits for it). DCP's collectives run on a gloo group of their own, so a background save never
interleaves with the step's collectives on the default group (torchtitan does the same). A
save counts once rank 0 has written its record and ``latest`` (autoplan/execute/checkpoint/store.py).

:class:`StopRequest` turns SIGTERM and SIGINT (what a scheduler, the launcher or Ctrl-C sends)
into a flag; after each step the ranks agree on it (an all-reduce of one number), save a
final checkpoint, and leave, before the launcher's grace period ends.
"""

from __future__ import annotations

import signal
import threading
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from autoplan.errors import CheckpointError
from autoplan.execute.checkpoint import store
from autoplan.execute.checkpoint.residual import per_rank
from autoplan.execute.checkpoint.state import EXTRA, MODEL, OPTIM, RNG, trainer_state


class Checkpointer:
    """Periodic, final and resumed checkpoints of one run (module docstring)."""

    def __init__(self, *, root: str | Path, every: int, async_save: bool, keep: int, record: dict[str, Any]):
        self.root, self.every, self.async_save, self.keep = Path(root), every, async_save, keep
        self.record = record  # CheckpointInfo fields fixed for the run: model identity, seed, batch
        self.group = dist.new_group(backend="gloo")  # a collective: every rank builds its Checkpointer
        self.pending: tuple[Any, Path, store.CheckpointInfo] | None = None
        self.last_saved_step: int | None = None

    def due(self, steps_done: int) -> bool:
        return self.every > 0 and steps_done % self.every == 0

    def save(self, trainer: Any, *, steps_done: int, rows: list[dict]) -> None:
        """Checkpoint the state after ``steps_done`` steps (asynchronously with ``async_save``)."""
        import torch.distributed.checkpoint as dcp

        self.wait()  # one save in flight at a time
        step_dir = self.root / store.step_dir_name(steps_done)
        state = trainer_state(trainer)
        info = store.CheckpointInfo(
            step=steps_done,
            plan=trainer.plan.to_dict(),
            world_size=dist.get_world_size(),
            rows=[dict(r) for r in rows],
            **self.record,
        )
        if self.async_save:
            future = dcp.async_save(state.tensors, checkpoint_id=str(step_dir), process_group=self.group)
            self.pending = (future, step_dir, info)
        else:
            dcp.save(state.tensors, checkpoint_id=str(step_dir), process_group=self.group)
            self._finalize(step_dir, info)
        self.last_saved_step = steps_done

    def wait(self) -> None:
        """Finish the save in flight, if any."""
        if self.pending is None:
            return
        future, step_dir, info = self.pending
        self.pending = None
        future.result()
        self._finalize(step_dir, info)

    def _finalize(self, step_dir: Path, info: store.CheckpointInfo) -> None:
        if dist.get_rank() == 0:
            store.finalize(self.root, step_dir, info, keep=self.keep)
        dist.barrier(group=self.group)  # nobody starts the next save (or leaves) before it counts

    def load(self, trainer: Any, step_dir: Path, info: store.CheckpointInfo) -> None:
        """Load ``step_dir`` into ``trainer``, resharding to its plan; CheckpointError on a mismatch."""
        import torch.distributed.checkpoint as dcp

        state = trainer_state(trainer, for_load=True)
        metadata = store.read_dcp_metadata(step_dir)
        held = metadata.state_dict_metadata
        same_world = info.world_size == dist.get_world_size()
        for key in [k for k in state.tensors if k.startswith((EXTRA, RNG))]:
            if key not in held or (per_rank(key) and not same_world):
                del state.tensors[key]  # RNG or residuals of another world size, or a scale an fp32 run never had
        stateless = without_optimizer_state(state.tensors, held)
        shapes = {k: tuple(v.shape) for k, v in state.tensors.items() if k.startswith((MODEL, OPTIM)) and v.dim() > 0}
        store.check_tensors(step_dir, metadata, shapes)
        try:
            dcp.load(state.tensors, checkpoint_id=str(step_dir), process_group=self.group)
        except Exception as exc:  # noqa: BLE001 - a DCP read error is a corrupt checkpoint for the user
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
            raise CheckpointError(
                f"could not read checkpoint '{step_dir}' ({first}); it is corrupt or incomplete: "
                "resume from an earlier step directory."
            ) from exc
        state.write_back()
        forget_optimizer_state(trainer, stateless)


def without_optimizer_state(tensors: dict[str, Any], held: Any) -> list[str]:
    """Drop from ``tensors`` the optimizer states of each parameter the checkpoint holds none for (a parameter that
    never had a gradient: AdamW keeps no state for it, DINOv2's ``mask_token`` without a mask), which
    ``trainer_state(for_load=True)`` created to load into; return those parameters' FQNs. A checkpoint of another
    model still fails the check on its parameters themselves."""
    saved = {key[len(OPTIM) :].rsplit(".", 1)[0] for key in held if key.startswith(OPTIM)}
    names = {key[len(OPTIM) :].rsplit(".", 1)[0] for key in tensors if key.startswith(OPTIM)}
    stateless = sorted(name for name in names - saved if f"{MODEL}{name}" in held)
    for key in [k for k in tensors if k.startswith(OPTIM) and k[len(OPTIM) :].rsplit(".", 1)[0] in stateless]:
        del tensors[key]
    return stateless


def forget_optimizer_state(trainer: Any, names: list[str]) -> None:
    """After a load: no optimizer state for ``names``, as when the checkpoint was written."""
    if not names or not hasattr(trainer.optimizer, "state"):
        return
    from autoplan.execute.checkpoint.state import named_state

    held = named_state(trainer)
    for name in names:
        if name in held:
            trainer.optimizer.state.pop(held[name], None)


class StopRequest:
    """SIGTERM / SIGINT set a flag instead of ending the rank at once (module docstring)."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self) -> None:
        self.signum: int | None = None
        if threading.current_thread() is threading.main_thread():
            for sig in self.SIGNALS:
                signal.signal(sig, self._set)

    def _set(self, signum, _frame) -> None:
        self.signum = signum

    def agreed(self, device: torch.device) -> bool:
        """True on every rank once any rank was told to stop (a collective)."""
        flag = torch.tensor([0.0 if self.signum is None else 1.0], device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item() > 0)
