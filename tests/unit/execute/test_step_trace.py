"""autoplan run --trace's post-processing (execute/job/tracing.py ``rewrite``) on a torch.profiler-shaped
trace, the chunk labels (execute/labels.py), and the report's alignment (report/trace_diff.py)."""

from __future__ import annotations

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from autoplan.errors import AutoplanError, RunError
from autoplan.execute.job.tracing import rewrite
from autoplan.execute.labels import chunk_label, label_stages
from autoplan.report.trace_diff import timeline_diff
from autoplan.types.run_options import RunOptions
from autoplan.types.trace_names import THREADS, metadata_events

MAIN, WORKER = 11, 12


def _x(name, ts, dur, tid=MAIN, **extra):
    return {"ph": "X", "name": name, "pid": 7, "tid": tid, "ts": 1000.0 + ts, "dur": dur, "cat": "cpu_op", **extra}


def _raw():
    """A step as torch.profiler writes it on gloo: labels on the main thread, the collectives' time on a worker."""
    return {
        "traceEvents": [
            {"ph": "M", "name": "thread_name", "pid": 7, "tid": WORKER, "args": {"name": "gloo worker"}},
            _x("aten::eq", -5, 1),  # the labels' set-up, before the step: left out
            _x("step 4", 0, 100),
            _x("F mb0 c1", 5, 20, cat="user_annotation"),
            _x("aten::mm", 6, 10),
            _x("comm tp all_reduce 4096", 26, 1),
            _x("gloo:all_reduce", 27, 8, tid=WORKER),
            _x("B mb0 c1", 40, 30, cat="user_annotation"),
            _x("comm dp all_reduce 8192", 71, 1),
            _x("gloo:all_reduce", 72, 20, tid=WORKER),
            _x("comm pp send 512", 93, 2),
            _x("gloo:broadcast", 95, 1, tid=WORKER),  # issued outside the labels: stays on its thread
        ]
    }


def test_rewrite_names_the_stage_and_moves_each_collective_to_its_thread():
    trace = rewrite(_raw(), stage=1, rank=3, step=4)
    meta = {(e["name"], e["tid"]): e["args"] for e in trace["traceEvents"] if e["ph"] == "M"}
    assert meta[("process_name", 0)] == {"name": "stage 1"} and "rank 3" in meta[("process_labels", 0)]["labels"]
    events = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert all(e["pid"] == 1 for e in events)
    chunks = {e["name"]: (e["tid"], e["cat"], e["ts"], e["dur"]) for e in events if e["name"][1:3] == " m"}
    assert chunks == {"F mb0 c1": (0, "forward", 5.0, 20), "B mb0 c1": (0, "backward", 40.0, 30)}
    comm = sorted(
        (THREADS[e["tid"]], e["name"], e["ts"], e["dur"], e["args"]["bytes"]) for e in events if e["cat"] == "comm"
    )
    assert comm == [
        ("dp", "dp all_reduce", 72.0, 20, 8192),  # gloo's worker event, matched to its label in issue order
        ("pp", "pp send", 93.0, 2, 512),  # no worker event: the label stands for itself
        ("tp", "tp all_reduce", 27.0, 8, 4096),
    ]
    assert not any(e["name"].startswith("comm ") or e["name"] == "aten::eq" for e in events)
    assert trace["otherData"]["step_time_s"] == pytest.approx(100e-6)
    names = {e["args"]["name"] for e in trace["traceEvents"] if e["ph"] == "M" and e["name"] == "thread_name"}
    assert names == {"compute", "dp", "tp", "pp", "gloo worker"}
    assert [e["tid"] for e in events if e["name"] == "gloo:broadcast"] == [100]


def test_rewrite_refuses_a_trace_without_its_step():
    with pytest.raises(AutoplanError, match="step 5"):
        rewrite(_raw(), stage=0, rank=0, step=5)


def test_chunk_labels_reach_the_profiler_only_when_asked():
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        with chunk_label(True, "weight", 2, 3):
            torch.ones(4).sum()
        with chunk_label(False, "forward", 0, 0):
            torch.ones(4).sum()
    names = {e.name for e in prof.events()}
    assert "W mb2 c3" in names and "F mb0 c0" not in names


def test_label_stages_wraps_each_chunk_method_once():
    class Stage:
        stage_index = 5

        def forward_one_chunk(self, mb, *args, **kwargs):
            return ("F", mb)

        def backward_one_chunk(self, mb, loss=None, full_backward=True, last_backward=False):
            return ("B", mb, full_backward)

        def backward_weight_one_chunk(self, mb, last_backward=False):
            return ("W", mb)

    class Schedule:
        _stage = Stage()

    schedule = Schedule()
    label_stages(schedule)
    label_stages(schedule)  # the second call wraps nothing again
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        assert schedule._stage.backward_one_chunk(1, loss=None, full_backward=False) == ("B", 1, False)
        assert schedule._stage.forward_one_chunk(2, (), {}) == ("F", 2)
    names = [e.name for e in prof.events()]
    assert names.count("B mb1 c5") == 1 and names.count("F mb2 c5") == 1


def test_trace_steps_default_to_the_last_and_are_checked():
    assert RunOptions(model="m", plan="p", out="o", steps=4, trace=True).traced_steps() == (3,)
    assert RunOptions(model="m", plan="p", out="o", steps=4, trace=True, trace_steps="2,0").traced_steps() == (0, 2)
    assert RunOptions(model="m", plan="p", out="o", steps=4).traced_steps() == ()
    with pytest.raises(RunError, match="--trace-steps 4"):
        RunOptions(model="m", plan="p", out="o", steps=4, trace=True, trace_steps="4")
    with pytest.raises(RunError, match="needs --trace"):
        RunOptions(model="m", plan="p", out="o", trace_steps="1")


def _trace(stage, events, *, step_s):
    spans = [
        {"ph": "X", "pid": stage, "tid": THREADS.index(t), "name": n, "ts": 0.0, "dur": d, "cat": ""}
        for t, n, d in events
    ]
    return {
        "traceEvents": metadata_events(stage, stage, ["compute"]) + spans,
        "otherData": {"stage": stage, "step_time_s": step_s},
    }


def test_timeline_diff_aligns_chunks_collectives_and_steps_largest_first():
    predicted = _trace(
        0, [("compute", "F mb0 c0", 100.0), ("compute", "bubble", 5.0), ("dp", "dp sync", 40.0)], step_s=200e-6
    )
    measured = [
        _trace(
            0,
            [("compute", "F mb0 c0", 150.0), ("dp", "dp all_reduce", 30.0), ("dp", "dp all_reduce", 20.0)],
            step_s=300e-6,
        ),
        _trace(0, [("compute", "F mb0 c0", 250.0), ("dp", "dp all_reduce", 70.0)], step_s=500e-6),
    ]
    rows = timeline_diff(predicted, measured).set_index("event")
    assert list(rows.index) == ["step", "F mb0 c0", "dp"]  # by diff_ms, largest first; the bubble is not an event
    assert rows.loc["F mb0 c0", "measured_s"] == pytest.approx(200e-6)  # the median of 150 and 250 µs
    assert rows.loc["F mb0 c0", "ratio"] == pytest.approx(2.0) and rows.loc["F mb0 c0", "diff_ms"] == pytest.approx(0.1)
    assert rows.loc["dp", "measured_s"] == pytest.approx(60e-6) and rows.loc["dp", "what"] == "communication"
    assert rows.loc["step", "predicted_s"] == pytest.approx(200e-6) and rows.loc["step", "measured_traces"] == 2
