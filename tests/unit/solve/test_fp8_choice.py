"""FP8 is the user's choice (issue 30 item 18): it changes the numerics and its kernels need FP8
tensor cores, so the planner searches it only with ``allow_fp8`` (``--allow-fp8``) or a
``precision=fp8`` pin, on plan, sweep and replan alike; explain says in one line what the best FP8
plan would gain when it was left out. A GPT wide enough for FP8 to pay on H100s
(tests/unit/cost/test_fp8.py prices why)."""

from pathlib import Path

import pytest
from synthetic import synthetic_gpt

from autoplan.cli import main
from autoplan.profile import load_profile
from autoplan.report.explain import explain_result
from autoplan.report.folder import PlanFolder
from autoplan.solve.api import plan_graph
from autoplan.solve.cluster import sweep_graph
from autoplan.solve.replan import allowed_fp8
from autoplan.types.plan import Plan

GPT = str(Path(__file__).resolve().parents[3] / "examples" / "gpt.py")


@pytest.fixture(scope="module")
def h100():
    return load_profile("dgx-h100")


@pytest.fixture(scope="module")
def graph():
    return synthetic_gpt(layers=4, hidden=4096, heads=32, vocab=32000, seq=2048, batch=32)


@pytest.fixture(scope="module")
def searches(graph, h100):
    def search(**options):
        return plan_graph(graph, devices=8, profile=h100, batch_size=32, **options)

    return {"default": search(), "allowed": search(allow_fp8=True), "pinned": search(fix={"precision": "fp8"})}


def test_fp8_is_searched_only_when_allowed_or_pinned(searches):
    assert searches["default"].best.precision == "bf16"
    assert not any(c.plan and c.plan.precision == "fp8" for c in searches["default"].candidates)
    assert searches["allowed"].best.precision == searches["pinned"].best.precision == "fp8"
    assert searches["allowed"].best_cost.step_time_s < searches["default"].best_cost.step_time_s
    assert searches["allowed"].best.predicted.search.allow_fp8
    assert not searches["default"].best.predicted.search.allow_fp8


def test_explain_says_what_fp8_would_gain_when_it_was_left_out(searches, graph, h100):
    left_out = explain_result(searches["default"], graph=graph, profile=h100, sensitivity=False)
    best_fp8 = searches["allowed"]
    ratio = best_fp8.best_cost.step_time_s / searches["default"].best_cost.step_time_s
    assert left_out.fp8.startswith("FP8 (not searched: --allow-fp8") and best_fp8.best.describe() in left_out.fp8
    assert f"{ratio:.2f}x the chosen plan's" in left_out.fp8 and left_out.fp8 in left_out.to_markdown()
    trade = {row["option"]: row for row in left_out.trade}
    assert not trade["fp8, reduce fp32"]["allowed"] and trade["fp8, reduce fp32"]["needs"] == "--allow-fp8"
    for searched in ("allowed", "pinned"):
        assert explain_result(searches[searched], graph=graph, profile=h100, sensitivity=False).fp8 == ""


def test_a_sweep_picks_fp8_only_when_allowed(graph):
    def precision(**options):
        result = sweep_graph(graph, devices=[8], profiles=["aws-p5"], run={"steps": 1000}, **options)
        return result.recommended.plan.precision

    assert (precision(), precision(allow_fp8=True)) == ("bf16", "fp8")


def test_replan_and_explain_keep_fp8_for_plans_that_had_it(searches):
    fp8, bf16 = searches["allowed"].best, searches["default"].best
    assert allowed_fp8(fp8) and not allowed_fp8(bf16)
    older = Plan.from_dict({**fp8.to_dict(), "predicted": {**fp8.predicted.to_dict(), "search": {"fixes": {}}}})
    assert allowed_fp8(older)  # an FP8 plan of before the flag was searched with FP8
    folder = PlanFolder(path=Path("."), plan=older, plans=None, ops=None, stages=None, graph=None, profile=None)
    assert folder.search_options["allow_fp8"]


def test_the_commands_take_allow_fp8(monkeypatch, tmp_path):
    small = {"N_LAYER": "2", "N_EMBD": "32", "N_HEAD": "4", "VOCAB_SIZE": "128", "BLOCK_SIZE": "16"}
    for field, value in small.items():
        monkeypatch.setenv(f"AUTOPLAN_GPT_{field}", value)
    args = [GPT, "--devices", "8", "--batch", "16", "--allow-fp8", "--quiet"]
    assert main(["plan", *args, "--profile", "dgx-h100", "--out", str(tmp_path / "p")]) == 0
    assert Plan.load(tmp_path / "p" / "plan.json").predicted.search.allow_fp8
    assert main(["sweep", *args, "--profile", "aws-p5", "--steps", "10", "--out", str(tmp_path)]) == 0
    assert Plan.load(tmp_path / "plan.json").predicted.search.allow_fp8
