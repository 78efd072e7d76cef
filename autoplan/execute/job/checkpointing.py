"""Checkpoints inside ``autoplan run``: where a run starts, when it saves, and injected faults.

A run starts from step 0 unless it resumes: ``--resume D`` (a checkpoint directory or one step
directory in it), or the newest checkpoint already in ``--checkpoint-dir`` (a job that Slurm
requeued, or torchelastic restarted, runs the same command again and goes on where it stopped;
after a restart that directory wins over an older ``--resume``). It then continues at the
checkpoint's step with its weights, optimizer state, loss scale, RNG states and measured rows;
batch ``k`` is drawn from seed ``seed + 1 + k`` in every run, so the data continue too.

With a checkpoint directory the run saves every ``--checkpoint-every`` steps, at its end, and
when a stop signal arrives (autoplan/execute/checkpoint/manager.py).

``AUTOPLAN_INJECT_FAULT=RANK:STEP[:ATTEMPTS]`` makes rank RANK exit abruptly (``os._exit``)
before step STEP, in the first ATTEMPTS attempts of the job (default 1; attempt = the restart
count): how the tests and docs/elastic.md show a crash being recovered.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch.distributed as dist

from autoplan.errors import CheckpointError, RunError
from autoplan.execute.checkpoint import store
from autoplan.execute.checkpoint.manager import Checkpointer, StopRequest
from autoplan.jobs.lifeline import LAUNCHER_PID_ENV

RESTART_ENV = "TORCHELASTIC_RESTART_COUNT"
FAULT_ENV = "AUTOPLAN_INJECT_FAULT"
FAULT_EXIT = 75
KEEP = 2  # checkpoints kept: the newest may be cut short by a crash while it is written


def restart_count() -> int:
    value = os.environ.get(RESTART_ENV, "0")
    return int(value) if value.isdigit() else 0


SHARED_STORE_OFF = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"


def shared_store_warning(*, elastic: bool, environ: dict[str, str] | None = None) -> str | None:
    """The line rank 0 prints when ``--elastic`` runs under a user's torchrun whose agents share their
    rendezvous store with the ranks (torch's default, ``TORCHELASTIC_USE_AGENT_STORE=True``). torch 2.13's
    ``DynamicRendezvousHandler.next_rendezvous`` publishes that store's address only in rank 0's first round, so a
    node that joins a later round (a node range such as ``--nnodes 1:4``, a replaced node) waits for it until the
    store's timeout, and the other agents wait for the joining node. None without ``--elastic``, with
    ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``, and under autoplan's own one-host launcher, where no node joins."""
    env = os.environ if environ is None else environ
    if not elastic or env.get("TORCHELASTIC_USE_AGENT_STORE") != "True" or LAUNCHER_PID_ENV in env:
        return None
    return (
        "autoplan: warning: --elastic under torchrun's shared rendezvous store: a node that joins this job later "
        f"hangs every agent (torch's dynamic rendezvous); start torchrun with {SHARED_STORE_OFF}=1 (docs/elastic.md)."
    )


@dataclass
class Session:
    """One run's checkpointing: where it started, and saving as it goes."""

    checkpointer: Checkpointer | None = None
    stop: StopRequest | None = None
    start_step: int = 0
    rows: list[dict[str, Any]] = field(default_factory=list)
    resumed_from: Path | None = None

    def after_step(self, trainer: Any, *, steps_done: int, rows: list[dict]) -> bool:
        """Save when due or told to stop; True when the run must stop now (every rank agrees)."""
        if self.checkpointer is None:
            return False
        stopping = self.stop.agreed(trainer.device) if self.stop else False
        if stopping or self.checkpointer.due(steps_done):
            self.checkpointer.save(trainer, steps_done=steps_done, rows=rows)
        return stopping

    def close(self, trainer: Any, *, steps_done: int, rows: list[dict]) -> None:
        """The final checkpoint (unless this step's is written), and wait for any save in flight."""
        if self.checkpointer is None:
            return
        if self.checkpointer.last_saved_step != steps_done and steps_done > self.start_step:
            self.checkpointer.save(trainer, steps_done=steps_done, rows=rows)
        self.checkpointer.wait()

    def abandon(self) -> None:
        """No final checkpoint (the weights are not worth keeping: a non-finite loss); wait for any save in flight."""
        if self.checkpointer is not None:
            self.checkpointer.wait()


def checkpoint_root(opts: Any) -> Path | None:
    """Where this run saves: --checkpoint-dir, else the directory --resume read from."""
    if opts.checkpoint_dir:
        return Path(opts.checkpoint_dir)
    if opts.resume:
        step_dir = store.find_checkpoint(opts.resume)
        return step_dir.parent
    return None


def resume_source(opts: Any) -> Path | None:
    """The checkpoint this run continues from (module docstring), or None for step 0: after a
    restart, the newest in the checkpoint directory (not an older --resume); else --resume; else
    the newest already in --checkpoint-dir (a requeued job resumes by itself)."""
    root = Path(opts.checkpoint_dir) if opts.checkpoint_dir else None
    newest = store.find_checkpoint(root) if root is not None and store.complete_checkpoints(root) else None
    if restart_count() > 0 and newest is not None:
        return newest
    if opts.resume:
        return store.find_checkpoint(opts.resume)
    return newest


def open_session(*, opts: Any, trainer: Any) -> Session:
    """Build the checkpointer and load the checkpoint to resume from, if any."""
    root = checkpoint_root(opts)
    if root is None:
        return Session()
    record = {
        "model_file": str(Path(opts.model).resolve()),
        "model_sha256": store.model_sha256(opts.model),
        "seed": opts.seed,
        "global_batch_size": trainer.plan.global_batch_size,
    }
    session = Session(
        checkpointer=Checkpointer(
            root=root, every=opts.checkpoint_every or 0, async_save=opts.async_checkpoint, keep=KEEP, record=record
        ),
        stop=StopRequest(),
    )
    source = resume_source(opts)
    if source is None:
        if restart_count() > 0 and dist.get_rank() == 0:
            print(f"autoplan: restart {restart_count()}: no checkpoint in {root} yet; starting at step 0", flush=True)
        return session
    info = store.read_info(source)
    _check_resumable(info, opts=opts, plan=trainer.plan, source=source)
    session.checkpointer.load(trainer, source, info)
    session.start_step, session.rows, session.resumed_from = info.step, list(info.rows), source
    if dist.get_rank() == 0:
        print(f"autoplan: resumed from {source} at step {info.step} of {opts.steps}", flush=True)
    return session


def check_resumable(info: store.CheckpointInfo, *, source: Path, steps: int, verify: bool) -> None:
    """Refuse a resume that cannot train (CheckpointError): the checkpoint is already at ``steps``,
    or --verify, whose reference starts from the initial weights. Checked by the CLI before any
    rank starts, and by each rank (under torchrun, after a restart, from the API)."""
    if info.step >= steps:
        raise CheckpointError(
            f"checkpoint '{source}' is already at step {info.step}; ask for more --steps than {steps}, "
            "or give a new --checkpoint-dir to start over."
        )
    if verify:
        raise CheckpointError(
            "--verify compares the first steps with a reference built from the initial weights, "
            "so it cannot follow a resume; run --verify without --resume."
        )


def _check_resumable(info: store.CheckpointInfo, *, opts: Any, plan: Any, source: Path) -> None:
    check_resumable(info, source=source, steps=opts.steps, verify=opts.verify)
    if info.global_batch_size != plan.global_batch_size and dist.get_rank() == 0:
        print(
            f"autoplan: warning: the checkpoint was trained with global batch {info.global_batch_size}, this plan "
            f"uses {plan.global_batch_size}; `autoplan replan` keeps the batch.",
            file=sys.stderr,
            flush=True,
        )


def maybe_inject_fault(step: int) -> None:
    """Exit abruptly here when AUTOPLAN_INJECT_FAULT says so (module docstring)."""
    spec = os.environ.get(FAULT_ENV)
    if not spec:
        return
    parts = spec.split(":")
    if not (2 <= len(parts) <= 3 and all(p.isdigit() for p in parts)):
        raise RunError(f"{FAULT_ENV}={spec!r}: expected RANK:STEP or RANK:STEP:ATTEMPTS, e.g. 1:3.")
    rank, at = int(parts[0]), int(parts[1])
    attempts = int(parts[2]) if len(parts) == 3 else 1
    if int(os.environ.get("RANK", "0")) == rank and step == at and restart_count() < attempts:
        print(f"autoplan: injected fault: rank {rank} exits before step {step}", file=sys.stderr, flush=True)
        sys.stderr.flush()
        os._exit(FAULT_EXIT)
