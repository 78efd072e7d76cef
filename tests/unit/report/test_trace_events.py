"""The predicted trace (timeline.json): every stage's track ends at the predicted step time, each priced
term is drawn as its own events, the names follow the contract, and `autoplan plan` writes it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from synthetic import synthetic_gpt, synthetic_profile

from autoplan.cli import main
from autoplan.cost import CostModel
from autoplan.profile.io import load_profile
from autoplan.report.trace_events import THREADS, predicted_trace, stage_track_ends_s, trace_of_plan
from autoplan.solve.api import plan_graph
from autoplan.solve.outputs import write_outputs
from autoplan.trace import trace_model_file

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
BATCH = 8
#: (example, profile, pins, runtime): the free pick, pp > 1 under each schedule family, tp, MoE with ep
CASES = {
    "gpt": ("gpt.py", "dgx-a100", "", "autoplan"),
    "gpt-pp2-zb": ("gpt.py", "dgx-a100", "pp=2,schedule=interleaved_zb", "autoplan"),
    "gpt-pp2-1f1b": ("gpt.py", "dgx-a100", "pp=2,schedule=1f1b", "autoplan"),
    "gpt-pp2-gpipe": ("gpt.py", "synthetic", "pp=2,schedule=gpipe", "autoplan"),
    "gpt-pp2-interleaved": ("gpt.py", "dgx-a100", "pp=2,schedule=interleaved_1f1b", "autoplan"),
    "gpt-pp2-zbv": ("gpt.py", "dgx-a100", "pp=2,schedule=zbv", "autoplan"),
    "gpt-pp2-dualpipev": ("gpt.py", "dgx-a100", "pp=2,schedule=dualpipev", "autoplan"),
    "gpt-tp2": ("gpt.py", "synthetic", "tp=2,pp=1", "autoplan"),
    "gpt-tp2-pp2-sp": ("gpt.py", "synthetic", "tp=2,pp=2,sp=true", "autoplan"),
    "moe-ep2": ("moe.py", "dgx-a100", "ep=2", "autoplan"),
    "moe-ep2-overlap": ("moe.py", "dgx-a100", "ep=2,moe_a2a_overlap=on", "megatron"),
    "moe-ep2-dualpipev-overlap": ("moe4", "dgx-a100", "ep=2,pp=2,schedule=dualpipev,moe_a2a_overlap=on", "autoplan"),
    # Plan.schedule_steps k: k schedule steps of m / k an optimizer step (docs/cost-model.md "Schedule steps")
    "gpt-pp2-1f1b-k2-zero3": ("gpt.py", "dgx-a100", "pp=2,schedule=1f1b,schedule_steps=2,zero=3", "autoplan"),
    "gpt-pp2-1f1b-k4-zero2": ("gpt.py", "dgx-a100", "pp=2,schedule=1f1b,schedule_steps=4,zero=2", "autoplan"),
    "gpt-pp2-inter-k2": ("gpt.py", "dgx-a100", "pp=2,schedule=interleaved_1f1b,zero=2,schedule_steps=2", "autoplan"),
    "gpt-pp2-inter-k4": ("gpt.py", "dgx-a100", "pp=2,schedule=interleaved_1f1b,schedule_steps=4", "autoplan"),
    "gpt-pp2-zb-k2": ("gpt.py", "dgx-a100", "pp=2,schedule=interleaved_zb,schedule_steps=2", "autoplan"),
    "gpt-pp2-zbv-k2": ("gpt.py", "dgx-a100", "pp=2,schedule=zbv,schedule_steps=2", "autoplan"),
    "gpt-pp2-dualpipev-k2": ("gpt.py", "dgx-a100", "pp=2,schedule=dualpipev,schedule_steps=2", "autoplan"),
}
STEPS_CASES = sorted(name for name in CASES if "-k" in name)
#: cases on fewer than 8 devices: DualPipeV at pp 2 needs 4 micro-batches of the batch of 8 per dp rank
DEVICES = {"moe-ep2-dualpipev-overlap": 4}
TERM_THREADS = {"tp_comm_s": "tp", "ep_comm_s": "ep", "cp_comm_s": "cp"}


@pytest.fixture(scope="module")
def graphs():
    traced = {name: trace_model_file(EXAMPLES / name, BATCH) for name in ("gpt.py", "moe.py")}
    with pytest.MonkeyPatch.context() as env:
        env.setenv("AUTOPLAN_MOE_LAYERS", "4")  # a V of 2 pp chunks, one MoE block each
        traced["moe4"] = trace_model_file(EXAMPLES / "moe.py", BATCH)
    return traced


@pytest.fixture(scope="module", params=sorted(CASES))
def case(request, graphs, tmp_path_factory):
    example, profile_name, fix, runtime = CASES[request.param]
    profile = synthetic_profile() if profile_name == "synthetic" else load_profile(profile_name)
    graph = graphs[example]
    devices = DEVICES.get(request.param, 8)
    result = plan_graph(graph, devices=devices, profile=profile, batch_size=BATCH, fix=fix, runtime=runtime)
    folder = tmp_path_factory.mktemp(request.param)
    write_outputs(folder, result=result, graph=graph, profile=profile)
    return request.param, result.best, graph, profile, predicted_trace(folder)


def _spans(trace, pid, *, tid=None, cat=None):
    return [
        e
        for e in trace["traceEvents"]
        if e["ph"] == "X" and e["pid"] == pid and (tid is None or e["tid"] == tid) and (cat is None or e["cat"] == cat)
    ]


def _seconds(events) -> float:
    return sum(e["dur"] for e in events) / 1e6


def test_every_stage_track_ends_at_the_predicted_step(case):
    _, plan, _, _, trace = case
    ends = stage_track_ends_s(trace)
    assert sorted(ends) == list(range(plan.pp))
    for end in ends.values():
        assert end == pytest.approx(plan.predicted.step_time_s, rel=1e-9)


def test_a_stage_track_is_tiled_without_gaps_or_overlaps(case):
    """Outside the hidden collectives, a stage's events follow one another from 0 to the step's end: the
    bubble fills every wait, so no priced second is left out and none is drawn twice."""
    _, plan, _, _, trace = case
    for pid in range(plan.pp):
        spans = sorted((e["ts"], e["ts"] + e["dur"]) for e in _spans(trace, pid) if e["cat"] != "hidden")
        cursor = 0.0
        for start, end in spans:
            assert start == pytest.approx(cursor, abs=1e-6 * plan.predicted.step_time_s * 1e6)
            cursor = end
        assert cursor / 1e6 == pytest.approx(plan.predicted.step_time_s, rel=1e-9)


def test_each_priced_term_is_drawn_on_the_slowest_stage(case):
    """The slowest stage's events sum to each term of the Cost: dropping one changes its sum."""
    name, plan, graph, profile, trace = case
    model = CostModel(graph, profile)
    stages, _, _ = model.priced_stages(plan)
    slowest = stages.index(max(stages, key=lambda s: s.micro_batch_s))
    cost = model.estimate(plan)
    compute = _spans(trace, slowest, tid=0)
    chunks = [e for e in compute if e["cat"] in ("forward", "backward", "weight")]
    assert _seconds(chunks) == pytest.approx(cost.compute_s, rel=1e-9)
    for term, thread in TERM_THREADS.items():
        exposed = _spans(trace, slowest, tid=THREADS.index(thread), cat="exposed")
        assert _seconds(exposed) == pytest.approx(getattr(cost, term), rel=1e-9, abs=1e-15), term
    dp = THREADS.index("dp")
    assert _seconds(_spans(trace, slowest, tid=dp, cat="exposed")) == pytest.approx(
        cost.dp_comm_exposed_s + cost.zero_comm_s, rel=1e-9, abs=1e-15
    )
    assert _seconds(_spans(trace, slowest, tid=dp, cat="hidden")) == pytest.approx(
        cost.dp_comm_s - cost.dp_comm_exposed_s, rel=1e-9, abs=1e-15
    )
    tail = {e["name"]: e["dur"] / 1e6 for e in _spans(trace, slowest, cat="tail")}
    assert tail.get("optimizer step") == pytest.approx(cost.optimizer_s, rel=1e-9)
    assert tail.get("gradient accumulation", 0.0) == pytest.approx(cost.grad_accum_s, rel=1e-9)
    if plan.pp > 1:
        assert cost.pp_comm_s > 0 and _spans(trace, slowest, tid=THREADS.index("pp"))
        assert cost.bubble_s > 0 and _spans(trace, slowest, tid=0, cat="bubble")
    if name.startswith("gpt-tp2"):
        assert cost.tp_comm_s > 0  # the case draws a tp term
    if name.startswith("moe"):
        assert cost.ep_comm_s > 0
    if name in ("moe-ep2-overlap", "moe-ep2-dualpipev-overlap"):
        assert _spans(trace, slowest, tid=THREADS.index("ep"), cat="hidden")


@pytest.mark.parametrize("case", ["moe-ep2-dualpipev-overlap"], indirect=True)
def test_an_overlapped_pair_draws_its_halves_side_by_side(case):
    """DualPipeV's F&B pairs (report/pair_layout.py): on each stage, every pair of its order is drawn with its
    forward half's compute and its backward half's interleaved, so the two halves' spans overlap in time, each
    half's all-to-all hidden beside the other half's compute; the step still ends at its priced time (above)."""
    from autoplan.cost import v_order

    name, plan, _, _, trace = case
    assert plan.moe_a2a_overlap and plan.schedule == "dualpipev"
    orders = v_order("dualpipev", pp=plan.pp, m=plan.num_microbatches)
    for stage in range(plan.pp):
        compute = _spans(trace, stage, tid=0)
        hidden = {e["name"] for e in _spans(trace, stage, tid=THREADS.index("ep"), cat="hidden")}
        pairs = [action for action in orders[stage] if action[0] == "FB"]
        assert pairs
        for _, f_chunk, f_mb, b_chunk, b_mb in pairs:
            halves = [f"F mb{f_mb} c{f_chunk}", f"B mb{b_mb} c{b_chunk}"]
            spans = [[(e["ts"], e["ts"] + e["dur"]) for e in compute if e["name"] == half] for half in halves]
            assert all(len(pieces) >= 2 for pieces in spans), (stage, halves, spans)
            (f_start, f_end), (b_start, b_end) = [(min(p)[0], max(e for _, e in p)) for p in spans]
            assert f_start < b_start < f_end < b_end, (stage, halves, spans)  # side by side, interleaved
            assert {f"ep all-to-all {half}" for half in halves} <= hidden


@pytest.mark.parametrize("case", STEPS_CASES, indirect=True)
def test_schedule_steps_are_drawn_one_after_another_each_with_its_fill_drain_and_syncs(case):
    """Plan.schedule_steps k: k schedule steps of m / k micro-batches end to end on every stage (all of step j's
    chunks before any of step j + 1's), each filling the pipeline anew (a bubble before the last stage's first
    chunk of every step) and followed by its own syncs under ZeRO-2/3 (report/step_syncs.py); the tracks still
    end at the priced step (test_every_stage_track_ends_at_the_predicted_step)."""
    _, plan, _, _, trace = case
    k, per = plan.schedule_steps, plan.num_microbatches // plan.schedule_steps
    assert k > 1 and trace["otherData"]["schedule_steps"] == k
    tolerance_us = 1e-6 * plan.predicted.step_time_s * 1e6
    for pid in range(plan.pp):
        chunks = [e for e in _spans(trace, pid, tid=0) if e["cat"] in ("forward", "backward", "weight")]
        steps = [[e for e in chunks if int(e["name"].split()[1][2:]) // per == j] for j in range(k)]
        for earlier, later in zip(steps, steps[1:]):
            assert max(e["ts"] + e["dur"] for e in earlier) <= min(e["ts"] for e in later) + tolerance_us
        if pid == plan.pp - 1:
            bubble_ends = [e["ts"] + e["dur"] for e in _spans(trace, pid, tid=0, cat="bubble")]
            for j, mine in enumerate(steps):
                first = min(e["ts"] for e in mine)
                assert any(abs(end - first) <= tolerance_us for end in bubble_ends), j
        dp = _spans(trace, pid, tid=THREADS.index("dp"))
        synced = {e["name"].rsplit(" ", 1)[1] for e in dp if ", schedule step" in e["name"]}
        assert synced == ({str(j) for j in range(k)} if plan.zero_stage >= 2 else set())


def test_chunk_events_are_named_per_microbatch_and_chunk(case):
    _, plan, _, _, trace = case
    names = {e["name"] for e in trace["traceEvents"] if e["ph"] == "X" and e["cat"] in ("forward", "backward")}
    chunks = plan.pp * plan.virtual_stages
    expected = {f"{k} mb{i} c{c}" for k in "FB" for i in range(plan.num_microbatches) for c in range(chunks)}
    assert names == expected
    weights = {e["name"] for e in trace["traceEvents"] if e["ph"] == "X" and e["cat"] == "weight"}
    assert weights == ({n.replace("B ", "W ", 1) for n in expected if n.startswith("B")} if weights else set())


def test_processes_threads_and_collective_args_follow_the_trace_format(case):
    _, plan, _, _, trace = case
    json.loads(json.dumps(trace))  # plain JSON
    assert trace["displayTimeUnit"] == "ms"
    meta = [e for e in trace["traceEvents"] if e["ph"] == "M"]
    processes = {e["pid"]: e["args"]["name"] for e in meta if e["name"] == "process_name"}
    assert processes == {k: f"stage {k}" for k in range(plan.pp)}
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in meta if e["name"] == "thread_name"}
    for e in trace["traceEvents"]:
        if e["ph"] != "X":
            continue
        assert e["dur"] >= 0 and e["ts"] >= 0
        assert threads[(e["pid"], e["tid"])] == THREADS[e["tid"]]
        if e["tid"] != 0:
            args = e["args"]
            assert args["bytes"] >= 0 and args["exposed_s"] + args["hidden_s"] == pytest.approx(e["dur"] / 1e6)
            assert (args["hidden_s"] > 0) == (e["cat"] == "hidden") or e["dur"] == 0


def test_autoplan_plan_writes_timeline_json(tmp_path):
    out = tmp_path / "plan"
    args = ["--devices", "2", "--batch", "8", "--profile", "cpu-gloo", "--out", str(out)]
    code = main(["--quiet", "plan", str(EXAMPLES / "mlp.py"), *args])
    assert code == 0
    trace = json.loads((out / "timeline.json").read_text())
    step = json.loads((out / "plan.json").read_text())["predicted"]["step_time_s"]
    assert list(stage_track_ends_s(trace).values()) == [pytest.approx(step, rel=1e-9)]


@pytest.mark.parametrize("fix", ["", "pp=4,schedule=dualpipev", "cp=2,pp=2"])
def test_every_priced_candidate_of_a_search_adds_up(fix):
    """Beyond the examples: each feasible candidate the search priced (every schedule, ZeRO stage,
    recomputation and degree it kept) draws tracks that end at its step time."""
    graph = synthetic_gpt(layers=8, hidden=1024, heads=16, vocab=32000, seq=1024, batch=32)
    profile = synthetic_profile(memory_bytes=24 * 2**30)
    result = plan_graph(graph, devices=16, profile=profile, batch_size=32, top_k=8, fix=fix)
    priced = [c for c in result.candidates if c.plan is not None and c.cost is not None and c.feasible]
    assert len(priced) > 60
    for c in priced[::3]:  # every third: the layouts vary along the list
        ends = stage_track_ends_s(trace_of_plan(c.plan, graph=graph, profile=profile))
        assert list(ends.values()) == [pytest.approx(c.cost.step_time_s, rel=1e-9)] * c.plan.pp, c.plan.describe()
