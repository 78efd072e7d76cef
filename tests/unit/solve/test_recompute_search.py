"""The search fits a recompute budget (issue 34 item 3): the fewest blocks per chunk that fit, pins, and
``autoplan explain``'s sentence on it (report/recompute_budget.py)."""

from dataclasses import replace

import pytest
from synthetic import gpt_graph, synthetic_profile

from autoplan.cost import CostModel, stage_peaks_bytes, usable_bytes
from autoplan.errors import PlanError
from autoplan.report.explain import explain
from autoplan.solve.api import plan_graph
from autoplan.solve.pins import parse_fixes
from autoplan.types import Plan

GIB = 2**30
PINS = "dp=1,tp=1,pp=1,mbs=8,precision=bf16,schedule=1f1b"


@pytest.fixture(scope="module")
def tight():
    """A graph and a device on which no recompute does not fit, every block recomputed does, and 5 of
    the 8 blocks recomputed in full is the fewest that fit."""
    graph = gpt_graph(layers=8, hidden=1024, heads=16, seq_len=1024, vocab=1024, batch_size=8, dtype_bytes=2)
    plan = Plan(devices=1, dp=1, tp=1, pp=1, micro_batch_size=8, num_microbatches=1, precision="bf16", recompute="full")
    peaks = [stage_peaks_bytes(CostModel(graph, synthetic_profile()), plan, [k])[0] for k in range(9)]
    memory = int((peaks[4] + peaks[5]) / 2 / usable_bytes(GIB) * GIB)
    return graph, synthetic_profile(memory_bytes=memory)


@pytest.fixture(scope="module")
def searched(tight):
    graph, profile = tight
    return plan_graph(graph, devices=1, profile=profile, batch_size=8, fix=PINS)


def test_the_search_recomputes_the_fewest_blocks_that_fit(tight, searched):
    graph, profile = tight
    result = searched
    best = result.best
    assert best.recompute != "none" and 0 < best.recompute_blocks[0] < 8, best.describe()
    model = CostModel(graph, profile)
    fewer = replace(best, recompute_blocks=[best.recompute_blocks[0] - 1], predicted=None)
    assert model.estimate(best).feasible and not model.estimate(fewer).feasible
    rows = {c.config["recompute"]: c for c in result.candidates if c.cost is not None}
    budgeted, every = rows[f"{best.recompute}:{best.recompute_blocks[0]}"], rows[best.recompute]
    assert every.feasible and every.cost.step_time_s > budgeted.cost.step_time_s  # every block recomputed is slower
    none = [c for c in result.candidates if c.config["recompute"] == "none"]  # priced, or set aside by its floor
    assert none and not any(c.feasible for c in none)


def test_a_pinned_budget_is_the_plans(tight):
    graph, profile = tight
    pinned = plan_graph(graph, devices=1, profile=profile, batch_size=8, fix=PINS + ",recompute_blocks=7")
    best = pinned.best
    assert best.recompute_blocks == [7] and best.recompute in ("full", "selective")
    sentence = explain(pinned, graph=graph, profile=profile, sensitivity=False).recompute  # 5 would fit: not fewest
    assert "7 of 8 blocks on stage 0, as pinned: recomputing one block fewer would still fit" in sentence
    piped = plan_graph(graph, devices=2, profile=synthetic_profile(), batch_size=8, fix="pp=2,recompute_blocks=3/1")
    assert piped.best.recompute_blocks == [3, 1] and piped.best.pp == 2


def test_a_pinned_recompute_mode_recomputes_every_block(tight):
    graph, profile = tight
    best = plan_graph(graph, devices=1, profile=profile, batch_size=8, fix=PINS + ",recompute=full").best
    assert best.recompute == "full" and best.recompute_blocks == []


@pytest.mark.parametrize(
    "text, message",
    [
        ("recompute_blocks=2,1", "not KEY=VALUE"),
        ("recompute_blocks=2/x", "one count >= 0 per pipeline chunk"),
        ("recompute=none,recompute_blocks=2", "with recompute=none"),
    ],
)
def test_a_bad_budget_pin_is_one_sentence(text, message):
    with pytest.raises(PlanError, match=message):
        parse_fixes(text)


def test_explain_says_why_k_of_l_blocks_recompute(tight, searched):
    graph, profile = tight
    best, k = searched.best, searched.best.recompute_blocks[0]
    sentence = explain(searched, graph=graph, profile=profile, sensitivity=False).recompute
    assert sentence.startswith(f"Recomputes ({best.recompute}) {k} of 8 blocks on stage 0, the fewest")
    fewer = stage_peaks_bytes(CostModel(graph, profile), best, [k - 1])[0] - usable_bytes(profile.device.memory_bytes)
    assert f"recomputing one block fewer needs {fewer / GIB:.2f} GiB more than the device has (stage 0)" in sentence
    assert "recomputing every block would take" in sentence
    whole = explain(
        plan_graph(graph, devices=1, profile=profile, batch_size=8, fix=PINS + ",recompute=full"),
        graph=graph,
        profile=profile,
        sensitivity=False,
    )
    assert whole.recompute == ""  # every block recomputed: no budget to explain


@pytest.mark.parametrize(
    "runtime, budget",
    [("autoplan", [3, 0]), ("megatron", [3, 3]), ("torchtitan", [])],  # per chunk; one count; every block
)
def test_each_runtime_gets_the_budget_it_runs(runtime, budget):
    """Two stages of 4 blocks at 1F1B: stage 0 holds more micro-batches in flight and needs 3 blocks
    recomputed to fit, stage 1 none. Megatron-LM runs one count on every chunk; torchtitan none. One schedule step
    (pinned: at 2 steps of 2 micro-batches fewer receive slots fit selective recompute, faster, where torch's
    schedules run: test_schedule_steps_choice.py)."""
    graph = gpt_graph(layers=8, hidden=1024, heads=16, seq_len=1024, vocab=1024, batch_size=8, dtype_bytes=2)
    profile = synthetic_profile(memory_bytes=int(1.2 * GIB / usable_bytes(GIB) * GIB))  # 1.2 GiB usable
    pins = "dp=1,tp=1,pp=2,mbs=2,precision=bf16,schedule=1f1b" + (",schedule_steps=1" if runtime != "megatron" else "")
    best = plan_graph(graph, devices=2, profile=profile, batch_size=8, fix=pins, runtime=runtime).best
    assert [len(chunk) for chunk in best.stages] == [4, 4]
    assert (best.recompute, best.recompute_blocks) == ("full", budget)
