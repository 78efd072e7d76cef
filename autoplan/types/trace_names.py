"""The names a step's trace uses, predicted (report/trace_events.py) and measured (execute/job/tracing.py)
alike, so the two line up in Perfetto and in ``autoplan report``'s alignment (docs/report.md, "The
predicted trace"): one process per pipeline stage, "stage K"; threads "compute" (tid 0) and one per
communication dimension, "dp", "tp", "pp", "ep", "cp" (tids 1-5); a chunk's event "F mb3 c0" (forward),
"B mb3 c0" (backward, or its input gradients), "W mb3 c0" (weight gradients), c the global chunk index.
"""

from __future__ import annotations

import re

COMM_THREADS = ("dp", "tp", "pp", "ep", "cp")
THREADS = ("compute", *COMM_THREADS)
LETTER = {"forward": "F", "backward": "B", "weight": "W"}
CHUNK_NAME = re.compile(r"^[FBW] mb\d+ c\d+$")
US_PER_S = 1e6
#: where ``autoplan run --trace`` writes its traces in the run folder: RUNDIR/traces/rank{r}_step{s}.json
TRACES_DIR = "traces"


def measured_trace_name(*, rank: int, step: int) -> str:
    return f"rank{rank}_step{step}.json"


def chunk_name(kind: str, microbatch: int, chunk: int) -> str:
    """The one name of a chunk's event: "F mb3 c0" (``kind`` forward, backward or weight)."""
    return f"{LETTER[kind]} mb{microbatch} c{chunk}"


def stage_process(stage: int) -> str:
    return f"stage {stage}"


def metadata_events(pid: int, stage: int, threads: list[str], *, label: str = "") -> list[dict]:
    """The ph "M" events naming process ``pid`` "stage K" (``label``: its process_labels) and its
    ``threads`` (THREADS' tids)."""
    events = [
        {"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": stage_process(stage)}},
        {"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": stage}},
    ]
    if label:
        events.append({"ph": "M", "name": "process_labels", "pid": pid, "tid": 0, "args": {"labels": label}})
    for thread in threads:
        tid = THREADS.index(thread)
        events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": thread}})
        events.append({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid, "args": {"sort_index": tid}})
    return events
