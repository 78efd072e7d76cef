"""``autoplan run --trace``: torch.profiler traces of the chosen steps on every rank, named as the plan's
predicted trace (docs/report.md, "The measured trace"; names in types/trace_names.py).

A traced step runs under torch.profiler (CPU activities, CUDA where present), its chunks labelled
(execute/labels.py) and every c10d collective inside ``record_function("comm <dim> <kind> <bytes>")``
by :class:`CommLabels`, which tells a process group's mesh dimension as the execution audit's
CommRecorder does (by its ranks). :func:`rewrite` then turns torch's trace into the predicted one's
shape: pid = the rank's pipeline stage ("stage K"), the thread that ran the step "compute" (tid 0),
each collective on its dimension's thread with args bytes. gloo runs a collective on a worker thread
whose "gloo:<kind>" event holds its real duration: it is matched to the first label of that kind issued
before it and not yet matched (gloo runs a group's collectives in issue order); a label left unmatched
(NCCL's kernels run on the GPU's streams) is drawn itself. Other threads and devices keep their
events on tids from 100. Times start at the step; what ran before it (the labels' set-up) is left out.
Written to ``RUNDIR/traces/rank{r}_step{s}.json``.
"""

from __future__ import annotations

import contextlib
import json
import tempfile
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile, record_function

from autoplan.errors import AutoplanError
from autoplan.execute.job.audit import (
    C10D_OPS,
    FUNCTIONAL_OPS,
    CommRecorder,
    _tensor_bytes,
    all_to_all_dims,
    group_dims,
)
from autoplan.execute.job.meters import on_dtensors
from autoplan.execute.labels import label_stages
from autoplan.types._check import write_text_atomic
from autoplan.types.trace_names import (
    CHUNK_NAME,
    COMM_THREADS,
    LETTER,
    THREADS,
    TRACES_DIR,
    measured_trace_name,
    metadata_events,
)

LABEL = "comm "
#: a recorder's dim -> the trace thread it is drawn on (the experts' data-parallel sync is dp's)
THREAD_OF_DIM = {"edp": "dp", "etp": "ep", "world": "dp"}
KIND_OF_LETTER = {letter: kind for kind, letter in LETTER.items()}
FIRST_OTHER_TID = 100


def trace_path(out: str | Path, *, rank: int, step: int) -> Path:
    return Path(out) / TRACES_DIR / measured_trace_name(rank=rank, step=step)


class CommLabels(CommRecorder):
    """Each collective this thread issues inside ``record_function("comm <dim> <kind> <bytes>")``."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if on_dtensors(types):
            return NotImplemented
        label = self._label(func.namespace, func.__name__.split(".")[0], args)
        with record_function(label) if label else contextlib.nullcontext():
            return func(*args, **(kwargs or {}))

    def _label(self, namespace: str, name: str, args: tuple) -> str | None:
        if namespace == "c10d" and name in C10D_OPS:
            kind, message, group = C10D_OPS[name]
            pg = dist.ProcessGroup.unbox(args[group]) if isinstance(args[group], torch.ScriptObject) else args[group]
            return f"{LABEL}{self._dim(pg, kind)} {kind} {_tensor_bytes(args[message])}"
        if namespace == "_c10d_functional" and name in FUNCTIONAL_OPS:
            kind, group, gathered = FUNCTIONAL_OPS[name]
            size = int(args[gathered]) if gathered is not None else 1
            return f"{LABEL}{self._dim(str(args[group]), kind)} {kind} {_tensor_bytes(args[0]) * size}"
        return None


def comm_labels(trainer: Any) -> CommLabels:
    """A :class:`CommLabels` over the trainer's mesh groups (audit.py ``group_dims``), cp's KV group by name."""
    experts, context = getattr(trainer, "experts", None), getattr(trainer, "context", None)
    groups = group_dims(trainer.mesh, None, experts, grad_mesh=getattr(trainer, "grad_mesh", None))
    named = {context.kv_group.group_name: "cp"} if context is not None else None
    return CommLabels(groups, all_to_all_dims(experts), named)


class StepTracer:
    """Profiles the steps ``opts.traced_steps()`` names on this rank; :meth:`write` saves them."""

    def __init__(self, opts: Any, trainer: Any):
        self.steps, self.out, self.trainer = set(opts.traced_steps()), opts.out, trainer
        self.rank, self.stage = dist.get_rank(), trainer.mesh.get_local_rank("pp")
        self.done: list[tuple[int, Any]] = []

    @contextlib.contextmanager
    def step(self, step: int):
        if step not in self.steps:
            yield
            return
        self.trainer.traced = True
        if self.trainer.schedule is not None:
            label_stages(self.trainer.schedule)
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
        with profile(activities=activities) as prof, comm_labels(self.trainer), record_function(f"step {step}"):
            yield
        self.trainer.traced = False
        self.done.append((step, prof))

    def write(self) -> None:
        for step, prof in self.done:
            with tempfile.TemporaryDirectory() as scratch:
                raw_path = Path(scratch) / "raw.json"
                prof.export_chrome_trace(str(raw_path))
                raw = json.loads(raw_path.read_text())
            trace = rewrite(raw, stage=self.stage, rank=self.rank, step=step)
            write_text_atomic(trace_path(self.out, rank=self.rank, step=step), json.dumps(trace))
        self.done.clear()


def rewrite(raw: dict, *, stage: int, rank: int, step: int) -> dict:
    """torch.profiler's Chrome trace of one step as the predicted trace's stage and threads (module docstring)."""
    events = [e for e in raw.get("traceEvents", []) if e.get("ph") == "X"]
    marker = next((e for e in events if e.get("name") == f"step {step}"), None)
    if marker is None:
        raise AutoplanError(f"the trace of step {step} has no 'step {step}' event: torch.profiler recorded nothing.")
    start, main = float(marker["ts"]), (marker["pid"], marker["tid"])
    events = [e for e in events if float(e["ts"]) >= start]  # the labels' set-up ran before the step
    comm = _collectives(events, main)
    others: dict[tuple, int] = {}
    out = []
    for e in events:
        if id(e) in comm or str(e.get("name", "")).startswith(LABEL):
            continue
        where = (e.get("pid"), e.get("tid"))
        tid = 0 if where == main else others.setdefault(where, FIRST_OTHER_TID + len(others))
        out.append(_moved(e, start=start, pid=stage, tid=tid, cat=_category(e, tid)))
    for e, (thread, kind, size) in comm.values():
        args = {"bytes": size, "kind": kind}
        out.append(
            _moved(e, start=start, pid=stage, tid=THREADS.index(thread), cat="comm", args=args, name=f"{thread} {kind}")
        )
    used = ["compute", *[t for t in COMM_THREADS if any(e["tid"] == THREADS.index(t) for e in out)]]
    meta = metadata_events(stage, stage, used, label=f"rank {rank}, step {step}")
    meta += [_thread_name(stage, tid, raw, where) for where, tid in others.items()]
    other = {"rank": rank, "stage": stage, "step": step, "step_time_s": float(marker["dur"]) / 1e6}
    return {"traceEvents": meta + out, "displayTimeUnit": "ms", "otherData": {**other, "source": "torch.profiler"}}


def _collectives(events: list[dict], main: tuple) -> dict[int, tuple[dict, tuple[str, str, int]]]:
    """id(event) -> (the event drawn for a collective, (thread, kind, bytes)): gloo's worker events matched
    to the labels, in issue order per kind; a label no worker event matched stands for itself."""
    labels = sorted((e for e in events if str(e.get("name", "")).startswith(LABEL)), key=lambda e: e["ts"])
    queues: dict[str, list[dict]] = {}
    for e in labels:
        queues.setdefault(e["name"].split()[2], []).append(e)
    found = {}
    for e in sorted((e for e in events if str(e.get("name", "")).startswith("gloo:")), key=lambda e: e["ts"]):
        queue = queues.get(e["name"][len("gloo:") :], [])
        if queue and queue[0]["ts"] <= e["ts"]:
            found[id(e)] = (e, _parsed(queue.pop(0)))
    for queue in queues.values():
        found.update({id(e): (e, _parsed(e)) for e in queue})
    return found


def _parsed(label: dict) -> tuple[str, str, int]:
    _, dim, kind, size = label["name"].split()
    return THREAD_OF_DIM.get(dim, dim if dim in COMM_THREADS else "dp"), kind, int(size)


def _category(event: dict, tid: int) -> str:
    name = str(event.get("name", ""))
    if tid == 0 and CHUNK_NAME.match(name):
        return KIND_OF_LETTER[name[0]]
    return str(event.get("cat", ""))


def _moved(
    event: dict, *, start: float, pid: int, tid: int, cat: str, args: dict | None = None, name: str = ""
) -> dict:
    moved = {
        "ph": "X",
        "name": name or event.get("name", ""),
        "cat": cat,
        "pid": pid,
        "tid": tid,
        "ts": float(event["ts"]) - start,
        "dur": float(event.get("dur", 0.0)),
    }
    if args is not None or event.get("args"):
        moved["args"] = args if args is not None else event["args"]
    return moved


def _thread_name(pid: int, tid: int, raw: dict, where: tuple) -> dict:
    names = {
        (e.get("pid"), e.get("tid")): e["args"].get("name", "")
        for e in raw.get("traceEvents", [])
        if e.get("ph") == "M" and e.get("name") == "thread_name"
    }
    return {
        "ph": "M",
        "name": "thread_name",
        "pid": pid,
        "tid": tid,
        "args": {"name": names.get(where) or f"thread {tid}"},
    }
