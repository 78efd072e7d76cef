"""torch.profiler labels of a traced step (``autoplan run --trace``; docs/report.md, "The measured trace"):
each chunk's forward, backward and weight-gradient run inside ``record_function("F mb3 c0")`` (the names of
types/trace_names.py, c the global chunk index), so the measured events carry the predicted trace's names.
Nothing is wrapped unless a step is traced: an untraced run pays nothing.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any, Callable

from torch.profiler import record_function

from autoplan.types.trace_names import chunk_name

#: a PipelineStage's method -> the kind of chunk it runs (B: the whole backward, or its input gradients)
STAGE_METHODS = (
    ("forward_one_chunk", "forward"),
    ("backward_one_chunk", "backward"),
    ("backward_weight_one_chunk", "weight"),
)


def chunk_label(enabled: bool, kind: str, microbatch: int, chunk: int = 0):
    """``record_function`` of the chunk's name when ``enabled``, else a context that does nothing."""
    return record_function(chunk_name(kind, microbatch, chunk)) if enabled else contextlib.nullcontext()


def label_stages(schedule: Any) -> None:
    """Wrap the chunk methods of every PipelineStage ``schedule`` runs in their labels (once per stage)."""
    stages = getattr(schedule, "_stages", None) or [schedule._stage]
    for stage in stages:
        if getattr(stage, "autoplan_labelled", False):
            continue
        for method, kind in STAGE_METHODS:
            setattr(stage, method, _labelled(getattr(stage, method), kind, stage.stage_index))
        stage.autoplan_labelled = True


def _labelled(run: Callable, kind: str, chunk: int) -> Callable:
    @functools.wraps(run)
    def labelled(microbatch: int, *args, **kwargs):
        with record_function(chunk_name(kind, microbatch, chunk)):
            return run(microbatch, *args, **kwargs)

    return labelled
