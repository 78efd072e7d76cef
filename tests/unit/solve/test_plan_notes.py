"""The one-line warnings about a chosen plan (solve/notes.py): too little memory headroom, with the
pin that buys more, and why dp is not larger when a rule or memory bound it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from synthetic import a100_profile, synthetic_gpt, synthetic_profile

from autoplan.cli import main
from autoplan.cost.memory.per_device import usable_bytes
from autoplan.solve.api import plan_graph
from autoplan.solve.candidates import Candidate, SearchResult, config_of
from autoplan.solve.notes import LOW_HEADROOM_FRACTION, dp_note, headroom_fraction, headroom_note, plan_notes
from autoplan.types.cost import Cost
from autoplan.types.plan import Plan

GPT = str(Path(__file__).resolve().parents[3] / "examples" / "gpt.py")


@pytest.fixture(scope="module")
def graph():
    return synthetic_gpt(layers=4, hidden=1024, heads=16, batch=64, seq=512)


@pytest.fixture(scope="module")
def roomy_peak_bytes(graph):
    profile = synthetic_profile(inter_busbw_bytes_per_s=200e9)
    result = plan_graph(graph, devices=16, profile=profile, batch_size=64)
    assert headroom_note(result, profile) is None
    return result.best.predicted.peak_memory_bytes


@pytest.fixture(scope="module")
def tight(graph, roomy_peak_bytes):
    """The same model on devices that leave its roomy plan 2% spare."""
    memory = int(roomy_peak_bytes * 1.02 / usable_bytes(1.0))
    profile = synthetic_profile(inter_busbw_bytes_per_s=200e9, memory_bytes=memory)
    return profile, plan_graph(graph, devices=16, profile=profile, batch_size=64)


def test_little_headroom_warns_with_a_pin_that_buys_room(graph, tight):
    profile, result = tight
    note = headroom_note(result, profile)
    spare = headroom_fraction(result.best.predicted.peak_memory_bytes, profile)
    assert spare < LOW_HEADROOM_FRACTION and f"{spare:.1%}" in note and "\n" not in note
    pin = re.search(r"--fix (\S+)\.$", note).group(1)
    pinned = plan_graph(graph, devices=16, profile=profile, batch_size=64, fix=pin)
    assert headroom_fraction(pinned.best.predicted.peak_memory_bytes, profile) >= LOW_HEADROOM_FRACTION
    slower = 100 * (pinned.best.predicted.step_time_s / result.best.predicted.step_time_s - 1)
    assert f"{slower:.1f}% slower" in note


def test_the_batch_that_does_not_divide_bounds_dp():
    """--devices 64 --batch 100: dp can only be 1, 2 or 4."""
    graph = synthetic_gpt(layers=8, hidden=4096, heads=32, batch=100, seq=2048)
    result = plan_graph(graph, devices=64, profile=a100_profile(), batch_size=100)
    assert result.best.dp == 4
    note = dp_note(result)
    assert note == (
        "dp is 4, not more: the batch of 100 (2^2 x 5^2) does not divide by dp=8, 16, 32 or 64; "
        "a batch of 104 allows dp=8, 128 every dp up to 64."
    )


def test_a_pin_that_bounds_dp_is_named(graph):
    profile = synthetic_profile(inter_busbw_bytes_per_s=200e9)
    result = plan_graph(graph, devices=16, profile=profile, batch_size=64, fix="tp=4")
    assert result.best.dp <= 4 and "--fix tp=4 refuses dp=" in dp_note(result)


def _candidate(dp: int, *, fits: bool, step_s: float) -> Candidate:
    plan = Plan(devices=8, dp=dp, tp=8 // dp, pp=1, micro_batch_size=1, num_microbatches=8 // dp)
    cost = Cost(step_time_s=step_s, peak_memory_bytes=1, feasible=fits)
    return Candidate(config=config_of(plan), status="evaluated", lower_bound=0, objective=step_s, cost=cost, plan=plan)


def _result(*candidates: Candidate) -> SearchResult:
    best = min((c for c in candidates if c.feasible), key=lambda c: c.objective)
    return SearchResult(best.plan, best.cost, list(candidates), 0.0, 0, "optimal", 0.0)


def test_memory_that_bounds_dp_is_named():
    result = _result(_candidate(4, fits=True, step_s=1.0), _candidate(8, fits=False, step_s=0.5))
    assert dp_note(result) == "dp is 4, not more: no plan with dp=8 fits in memory."


def test_no_dp_line_when_a_larger_dp_only_lost_on_speed():
    """explain's family verdicts say why a slower dp lost; the line is for rules and memory."""
    result = _result(
        _candidate(4, fits=True, step_s=1.0),
        _candidate(8, fits=True, step_s=1.2),
        _candidate(8, fits=False, step_s=0.5),
    )
    assert dp_note(result) is None


def test_plan_prints_the_dp_line(monkeypatch, tmp_path, capsys):
    for field, value in (
        ("N_LAYER", "2"),
        ("N_EMBD", "128"),
        ("N_HEAD", "4"),
        ("VOCAB_SIZE", "1024"),
        ("BLOCK_SIZE", "64"),
    ):
        monkeypatch.setenv(f"AUTOPLAN_GPT_{field}", value)
    args = ["plan", GPT, "--devices", "64", "--profile", "dgx-a100", "--batch", "100", "--out", str(tmp_path)]
    assert main(args) == 0
    warned = [line for line in capsys.readouterr().err.splitlines() if "dp is" in line]
    assert len(warned) == 1 and "the batch of 100 (2^2 x 5^2) does not divide by dp=8" in warned[0]


def test_explain_states_the_warnings(graph, tight):
    from autoplan.report.explain import explain

    profile, result = tight
    exp = explain(result, graph=graph, profile=profile, sensitivity=False)
    assert exp.warnings == plan_notes(result, profile) and exp.warnings
    assert f"**Warning:** {exp.warnings[0]}" in exp.to_markdown()
