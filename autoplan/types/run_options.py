"""The options of one ``autoplan run``, declared once: :class:`RunOptions`.

Each field carries its default and its help, and everything else is derived from it: the
``autoplan run`` command's flags (:func:`add_run_arguments`, autoplan/cli/execute.py), the
options a launched rank receives (:meth:`RunOptions.to_json` / :meth:`RunOptions.from_json`,
autoplan/cli/rank.py) and the ``autoplan run`` words a cluster job file runs on each node
(:meth:`RunOptions.command_words`, autoplan/jobs/nodejob.py). Built, it checks itself and
raises one sentence naming the flag to change (exit 2, never a traceback).

Units are in names: ``timeout_s`` and ``hang_timeout_s`` seconds.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import MISSING, asdict, dataclass, field, fields
from typing import Any

from autoplan.errors import RunError
from autoplan.types._check import require, require_known_fields

#: the argparse group of the checkpoint and restart flags
CHECKPOINTS = "checkpoints and restarts (docs/elastic.md)"


def _option(default: Any, help: str, *, kind: type = str, **extra: Any) -> Any:
    """A field with its flag's help; ``kind`` converts the flag's text. ``extra``: ``group`` (the
    argparse group), ``metavar``, ``required``, ``positional``, ``always`` (written into a job
    file's command even at its default) and ``flag=False`` (set by autoplan, not by a user)."""
    return field(default=default, metadata={"help": help, "kind": kind, **extra})


@dataclass(frozen=True)
class RunOptions:
    """What ``autoplan run`` was asked to do (module docstring)."""

    model: str = _option(
        None, "model file (defines build_model() and example_inputs(batch_size))", positional=True, required=True
    )
    plan: str = _option(None, "a plan folder (autoplan plan --out DIR) or its plan.json", required=True)
    steps: int = _option(10, "training steps (default {default})", kind=int, always=True)
    out: str = _option(None, "run folder to write", required=True)
    verify: bool = _option(
        False,
        "compare the first steps' loss, gradients and updated weights with a single-process reference, "
        "dropout off in both (2 steps, 3 with PowerSGD; docs/executor.md)",
    )
    audit: bool = _option(
        False,
        "after the timed steps, audit one step: collectives, parameters held, "
        "matmul FLOPs and peak live memory per rank beside the cost model's prediction (RUNDIR/audit.csv)",
    )
    trace: bool = _option(
        False,
        "record torch.profiler traces of the --trace-steps steps on every rank into RUNDIR/traces/ "
        "(Chrome/Perfetto JSON named as the plan's timeline.json; docs/report.md)",
    )
    trace_steps: str | None = _option(
        None, "the steps --trace records, comma-separated: N,M (default: the last step)", metavar="N,M"
    )
    seed: int = _option(0, "seed of the model's initialisation and of every step's batch (default 0)", kind=int)
    threads: int | None = _option(
        None, "threads per process (default: the profile's, else cores // processes)", kind=int
    )
    timeout_s: float = _option(45.0, "process-group timeout in seconds (default 45)", kind=float)
    hang_timeout_s: float = _option(
        10.0,
        "a rank whose heartbeat stops for max(S, 5 x the plan's predicted step time, 5 x its last step) is declared "
        "hung and the job stopped (default 10; 0: off, the process-group timeout alone; docs/executor.md 'Hung ranks')",
        kind=float,
        metavar="S",
    )
    checkpoint_dir: str | None = _option(
        None,
        "save checkpoints in D (at the end, on a stop signal, and as --checkpoint-every says)",
        group=CHECKPOINTS,
        metavar="D",
    )
    checkpoint_every: int | None = _option(
        None,
        "save every N steps (default: the plan's Young/Daly interval when its profile has failure data, else only "
        "at the end and on a stop signal)",
        kind=int,
        group=CHECKPOINTS,
        metavar="N",
    )
    async_checkpoint: bool = _option(
        False, "write checkpoints in the background while training goes on", group=CHECKPOINTS
    )
    resume: str | None = _option(
        None, "continue from the newest checkpoint in D (or the step directory D)", group=CHECKPOINTS, metavar="D"
    )
    max_restarts: int = _option(
        0,
        "restart the job from its last checkpoint when a rank fails, up to K times (torchelastic's agent)",
        kind=int,
        group=CHECKPOINTS,
        metavar="K",
    )
    elastic: bool = _option(
        False,
        "when the job has another number of ranks than the plan (a torchrun restart with fewer or more nodes), "
        "re-plan for it and reshard the checkpoint",
        group=CHECKPOINTS,
    )
    profile_threads: int | None = _option(
        None, "the threads of the plan's profile, read before the ranks start", kind=int, flag=False
    )

    def __post_init__(self) -> None:
        for name in ("model", "plan", "out"):
            require(isinstance(getattr(self, name), str), RunError, f"--{name} is required.")
        check_steps(steps=self.steps, checkpoint_every=self.checkpoint_every)
        require(self.max_restarts >= 0, RunError, f"--max-restarts {self.max_restarts}: expected 0 or more.")
        require(self.timeout_s > 0, RunError, f"--timeout-s {self.timeout_s}: expected a positive number of seconds.")
        hang = self.hang_timeout_s
        require(hang >= 0, RunError, f"--hang-timeout-s {hang}: expected 0 (off) or a positive number of seconds.")
        require(self.threads is None or self.threads >= 1, RunError, f"--threads {self.threads}: expected at least 1.")
        require(self.trace or self.trace_steps is None, RunError, "--trace-steps needs --trace.")
        self.traced_steps()

    def traced_steps(self) -> tuple[int, ...]:
        """The steps --trace records (none without it): --trace-steps, else the last step."""
        if not self.trace:
            return ()
        if self.trace_steps is None:
            return (self.steps - 1,)
        words = [w.strip() for w in self.trace_steps.split(",")]
        ok = all(w.isdigit() and int(w) < self.steps for w in words)
        require(ok, RunError, f"--trace-steps {self.trace_steps}: expected step numbers 0 to {self.steps - 1}, N,M.")
        return tuple(sorted({int(w) for w in words}))

    @classmethod
    def from_namespace(cls, args: argparse.Namespace) -> RunOptions:
        """The options parsed by :func:`add_run_arguments` (other attributes of ``args`` ignored)."""
        return cls(**{f.name: getattr(args, f.name) for f in fields(cls) if f.metadata.get("flag", True)})

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> RunOptions:
        data = json.loads(text)
        require(isinstance(data, dict), RunError, "the run options must be a JSON object.")
        require_known_fields(data, cls, RunError, "the run options")
        return cls(**data)

    def command_words(self) -> tuple[str, ...]:
        """``run MODEL --plan PLAN ...``: the ``autoplan run`` words that give these options
        (flags at their default left out, but those marked ``always``)."""
        words = ["run", self.model]
        for f in fields(self):
            value, meta = getattr(self, f.name), f.metadata
            if meta.get("positional") or not meta.get("flag", True) or not _written(f, value):
                continue
            words += [_flag(f.name)] if value is True else [_flag(f.name), str(value)]
        return tuple(words)


def check_steps(*, steps: int, checkpoint_every: int | None) -> None:
    """The step counts a run or a launched job takes: at least one step, and a positive checkpoint interval."""
    require(steps >= 1, RunError, f"--steps {steps}: expected at least 1 step.")
    every = checkpoint_every
    require(every is None or every >= 1, RunError, f"--checkpoint-every {every}: expected at least 1 step.")


def _written(f: Any, value: Any) -> bool:
    """Whether a job file's command names this field: required, ``always``, or set off its default."""
    if f.metadata.get("required") or f.metadata.get("always"):
        return True
    return value is not None and value is not False and value != f.default


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def add_run_arguments(
    parser: argparse.ArgumentParser, *, only: tuple[str, ...] | None = None, defaults: dict[str, Any] | None = None
) -> None:
    """Every user-set field of :class:`RunOptions` (or the fields named in ``only``) as a flag of
    ``parser``, with its help and default (``defaults`` overrides a field's: a launched job's length)."""
    defaults = defaults or {}
    groups: dict[str, Any] = {}
    for f in fields(RunOptions):
        meta = f.metadata
        if not meta.get("flag", True) or (only is not None and f.name not in only):
            continue
        target = parser
        if meta.get("group") and only is None:
            target = groups.setdefault(meta["group"], parser.add_argument_group(meta["group"]))
        if meta.get("positional"):
            target.add_argument(f.name, help=meta["help"])
        elif f.default is False:
            target.add_argument(_flag(f.name), action="store_true", help=meta["help"])
        else:
            extra = {"metavar": meta["metavar"]} if meta.get("metavar") else {}
            default = defaults.get(f.name, None if f.default is MISSING else f.default)
            target.add_argument(
                _flag(f.name),
                type=meta["kind"],
                default=default,
                required=bool(meta.get("required")),
                help=meta["help"].format(default=default),
                **extra,
            )
