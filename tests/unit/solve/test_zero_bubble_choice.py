"""The search picks a zero-bubble schedule unasked where its smaller bubble pays, a pin keeps it, and explain says
why in one sentence: the bubble saved against 1F1B and the memory paid (docs/cost-model.md, "Zero-bubble
schedules")."""

from __future__ import annotations

from synthetic import synthetic_gpt, synthetic_profile

from autoplan.cost import CostModel
from autoplan.report.explain import explain_result, objective_fn
from autoplan.report.sensitivity import batch_threshold
from autoplan.solve.api import plan_graph
from autoplan.solve.candidates import SearchOptions
from autoplan.solve.pins import parse_fixes
from autoplan.solve.search import Search
from autoplan.types import Plan

GRAPH = synthetic_gpt(layers=4, hidden=256, heads=8, vocab=8000, seq=128, batch=16)
PROFILE = synthetic_profile(memory_bytes=24 * 2**30)


def _search(fix: str):
    return plan_graph(GRAPH, devices=2, profile=PROFILE, batch_size=16, fix=fix)


def test_a_pipeline_picks_zero_bubble_and_explain_says_what_it_saves_and_pays():
    result = _search("pp=2,mbs=2,zero=0,recompute=none")
    assert result.best.schedule == "interleaved_zb"
    said = explain_result(result, graph=GRAPH, profile=PROFILE, sensitivity=False)
    assert said.zero_bubble.startswith("schedule interleaved_zb (")
    assert "of bubble against" in said.zero_bubble and "GiB more per device" in said.zero_bubble
    assert "**Schedule:**" in said.to_markdown()


def test_a_1f1b_pin_keeps_1f1b_and_explain_says_nothing_of_zero_bubble():
    result = _search("pp=2,mbs=2,zero=0,recompute=none,schedule=1f1b")
    assert result.best.schedule == "1f1b"
    assert explain_result(result, graph=GRAPH, profile=PROFILE, sensitivity=False).zero_bubble == ""


def test_zero_bubble_bounds_never_exceed_the_priced_step():
    """Bounds (1) and (2) keep a floor on (T - 2W) / T of the bubble (Bounds.zero_bubble_share,
    StageCosts.bubble_floor): still below every zero-bubble plan's priced step, at tp 1 and 2."""
    result = plan_graph(GRAPH, devices=4, profile=PROFILE, batch_size=16, fix="pp=2", top_k=10**6)
    zb = [c for c in result.candidates if c.status == "evaluated" and c.plan.schedule == "interleaved_zb"]
    assert {c.plan.tp for c in zb} == {1, 2} and any(c.plan.virtual_stages == 2 for c in zb)
    assert all(0 < c.lower_bound <= c.objective * (1 + 1e-9) for c in zb)


def test_the_batch_sensitivity_skips_batches_a_zero_bubble_plan_cannot_run():
    """The batch threshold re-prices the pipelined plan at other batches; those with fewer micro-batches
    than stages, or that torch's rounds do not divide, are not plans of its schedule (types/schedules.py):
    skipped, not raised."""
    piped = Plan(devices=2, dp=1, tp=1, pp=2, micro_batch_size=2, num_microbatches=8, schedule="interleaved_zb")
    flat = Plan(devices=2, dp=2, tp=1, pp=1, micro_batch_size=1, num_microbatches=8)
    found = batch_threshold(CostModel(GRAPH, PROFILE), [piped, flat], objective_fn("time", PROFILE, 16))
    assert found.knob == "global batch size"


def test_the_pruned_search_finds_the_exhaustive_best_with_zero_bubble_in_its_space():
    """Zero-bubble offered unasked (solve/schedules.py), its bounds (Bounds.zero_bubble_share, the stages' own
    bubble floor in StageCosts.bubble_floor) prune plans and still keep the best plan and its price of pricing
    every configuration."""
    options = SearchOptions(devices=4, batch_size=16, fixes=parse_fixes("pp=2,mbs=2,zero=0,recompute=none"))
    pruned = Search(GRAPH, PROFILE, options).run()
    everything = Search(GRAPH, PROFILE, options)
    everything._beaten = lambda bound: False  # price every candidate
    everything._usable_bytes = float("inf")  # whatever its memory floor
    everything.memory_first = False  # and the time of every plan that does not fit
    full = everything.run()
    assert full.best.schedule == "interleaved_zb" and pruned.pruned > 0
    priced_zb = [sum(c.config["schedule"] == "interleaved_zb" for c in r.candidates if c.cost) for r in (pruned, full)]
    assert 0 < priced_zb[0] < priced_zb[1]  # the bounds set some zero-bubble plans aside unpriced
    assert pruned.best.describe() == full.best.describe()
    assert pruned.best_cost.step_time_s == full.best_cost.step_time_s


def test_a_v_schedule_is_searched_only_pinned_and_explain_says_what_it_saves_and_pays():
    """zbv and dualpipev (docs/cost-model.md, "V schedules"): offered under their pin at v = 2, set against
    interleaved 1F1B over the same chunks in one sentence."""
    for name in ("zbv", "dualpipev"):
        result = _search(f"pp=2,mbs=2,zero=0,recompute=none,schedule={name}")
        assert (result.best.schedule, result.best.virtual_stages) == (name, 2)
        said = explain_result(result, graph=GRAPH, profile=PROFILE, sensitivity=False).zero_bubble
        assert said.startswith(f"schedule {name} (") and "under interleaved_1f1b over the same chunks" in said
        assert said.count(". ") == 0 and said.endswith("peaks.")
