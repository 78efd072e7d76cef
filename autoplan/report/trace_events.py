"""Steps as Chrome Trace Event Format JSON (docs/report.md, "The predicted trace"): the predicted one
(``timeline.json`` in the plan folder, :func:`predicted_trace`) and the measured ones of ``autoplan run
--trace`` share its names, so Perfetto (ui.perfetto.dev) and chrome://tracing show them alike.

One process per pipeline stage, "stage K" (pid K); threads "compute" (tid 0) and one per communication
dimension the step uses, "dp", "tp", "pp", "ep", "cp" (tids 1-5). Complete events (ph "X", ts and dur
in microseconds) name a chunk "F mb3 c0" / "B mb3 c0" / "W mb3 c0" (c the global chunk index), the
bubble "bubble", a collective "<dim> ..." with args bytes, exposed_s and hidden_s and category
"exposed" or "hidden"; metadata events (ph "M") name the processes and threads. The spans come from the
priced terms (report/step_layout.py), so every stage's last event ends at the predicted step time.
"""

from __future__ import annotations

import json
from pathlib import Path

from autoplan.cost import CostModel, predict_volumes
from autoplan.errors import AutoplanError
from autoplan.report.step_layout import Span, lay_out
from autoplan.types._check import write_text_atomic
from autoplan.types.graph import Graph
from autoplan.types.plan import Plan
from autoplan.types.profile import Profile
from autoplan.types.schedule_steps import schedule_step_plan
from autoplan.types.trace_names import THREADS, US_PER_S, metadata_events

TIMELINE_JSON = "timeline.json"
TID = {thread: tid for tid, thread in enumerate(THREADS)}
#: a re-priced step may differ from plan.json's in the last bits (libm), never more
REPRICE_RTOL = 1e-9


def span_event(span: Span) -> dict:
    event = {
        "ph": "X",
        "name": span.name,
        "cat": span.category,
        "pid": span.stage,
        "tid": TID[span.thread],
        "ts": span.start_s * US_PER_S,
        "dur": span.dur_s * US_PER_S,
    }
    if span.args:
        event["args"] = span.args
    return event


def trace_of(spans: list[Span], *, stages: int, other: dict) -> dict:
    """The trace dict of ``spans`` on ``stages`` pipeline stages, with ``other`` as its otherData."""
    drawn = {(s.stage, s.thread) for s in spans}
    events = []
    for k in range(stages):
        events += metadata_events(k, k, [t for t in THREADS if t == "compute" or (k, t) in drawn])
    events += [span_event(s) for s in sorted(spans, key=lambda s: (s.stage, s.start_s))]
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": other}


def predicted_spans(plan: Plan, *, graph: Graph, profile: Profile) -> list[Span]:
    """``plan`` re-priced on its graph and profile, laid out (report/step_layout.py)."""
    model = CostModel(graph, profile)
    stages, _tp_plan, _ctx = model.priced_stages(plan)
    cost = model.estimate(plan)
    if plan.predicted and abs(cost.step_time_s - plan.predicted.step_time_s) > REPRICE_RTOL * cost.step_time_s:
        raise AutoplanError(
            f"plan.json predicts {plan.predicted.step_time_s:.6g} s a step but this autoplan prices it at "
            f"{cost.step_time_s:.6g} s; re-run `autoplan plan` with this version to draw its trace."
        )
    step_bytes = [_dims_bytes(pred.comm) for pred in predict_volumes(model, plan)]
    step_cost = model.estimate(schedule_step_plan(plan)) if plan.schedule_steps > 1 else None  # one schedule step
    return lay_out(plan, stages, cost, step_bytes, step_cost)


def _dims_bytes(comm: dict) -> dict[str, float]:
    """Per trace thread, the step's bytes (cost/volumes.py dims; the experts' edp sync is drawn on "dp")."""
    out: dict[str, float] = {}
    for (dim, _kind), (_count, size) in comm.items():
        thread = "dp" if dim.startswith(("dp", "edp")) else dim
        out[thread] = out.get(thread, 0.0) + float(size)
    return out


def predicted_trace(plan_folder) -> dict:
    """The predicted step of ``plan_folder``'s plan (a path or a loaded PlanFolder) as a Chrome/Perfetto
    trace dict (module docstring)."""
    from autoplan.report.folder import PlanFolder, ReportError, load_plan_folder  # pandas: only when asked

    folder = plan_folder if isinstance(plan_folder, PlanFolder) else load_plan_folder(plan_folder)
    if folder.plan is None or folder.graph is None or folder.profile is None:
        raise ReportError(
            f"plan folder '{folder.path}' has no plan.json, graph.json or profile.json, so there is no predicted "
            "trace; re-run `autoplan plan`."
        )
    return trace_of_plan(folder.plan, graph=folder.graph, profile=folder.profile)


def trace_of_plan(plan: Plan, *, graph: Graph, profile: Profile) -> dict:
    """:func:`predicted_trace` of a plan in memory (``autoplan plan`` writes it before any folder is read)."""
    other = {
        "plan": plan.describe(),
        "schedule": plan.schedule,
        "num_microbatches": plan.num_microbatches,
        **({"schedule_steps": plan.schedule_steps} if plan.schedule_steps > 1 else {}),
        "step_time_s": plan.predicted.step_time_s if plan.predicted else None,
        "source": "autoplan predicted (docs/report.md, 'The predicted trace')",
    }
    return trace_of(predicted_spans(plan, graph=graph, profile=profile), stages=plan.pp, other=other)


def write_predicted_trace(out_dir: str | Path, *, plan: Plan, graph: Graph, profile: Profile) -> Path:
    """Write ``plan``'s timeline.json into ``out_dir``; return its path."""
    trace = trace_of_plan(plan, graph=graph, profile=profile)
    return write_text_atomic(Path(out_dir) / TIMELINE_JSON, json.dumps(trace))


def stage_track_ends_s(trace: dict) -> dict[int, float]:
    """Per pid, the end of its last complete event, in seconds: a stage's track length."""
    ends: dict[int, float] = {}
    for e in trace["traceEvents"]:
        if e.get("ph") == "X":
            ends[e["pid"]] = max(ends.get(e["pid"], 0.0), (e["ts"] + e["dur"]) / US_PER_S)
    return ends
