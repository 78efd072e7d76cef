"""cost/memory/shared.py: a stage's held counts and block facts memoised on the stage and its schedule key. Each
field of the key changes the counts where it should, and the memoised answer follows it; the memory of every
plan an exhaustive search prices (through the memo) equals its memory priced on copies (without it)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from synthetic import synthetic_gpt, synthetic_profile

from autoplan.cost import CostModel, memory_alone
from autoplan.cost.memory.shared import SharedStageMemo, block_facts, held
from autoplan.solve.candidates import SearchOptions
from autoplan.solve.search import Search
from autoplan.types.plan import Plan

GRAPH = synthetic_gpt(layers=8, hidden=256, heads=8, vocab=512, seq=512, batch=16)
PROFILE = synthetic_profile(memory_bytes=int(0.15 * 2**30))
BASE = dict(devices=16, dp=4, tp=1, pp=4, micro_batch_size=1, num_microbatches=8, precision="bf16")

#: (field, value) of the schedule key, each from the base plan (interleaved 1F1B, v = 2, torch's runtime)
CHANGES = [
    ("num_microbatches", 16),
    ("virtual_stages", 1, "schedule", "1f1b"),
    ("schedule", "interleaved_zb"),
    ("schedule", "zbv"),
    ("runtime", "megatron"),
    ("pp", 2, "devices", 8),
]


def _base() -> Plan:
    return Plan(**BASE, schedule="interleaved_1f1b", virtual_stages=2)


@pytest.mark.parametrize("change", CHANGES, ids=lambda change: "-".join(map(str, change)))
def test_each_field_of_the_key_changes_the_held_counts_and_the_memo_follows(change):
    base = _base()
    stages, _, _ = CostModel(GRAPH, PROFILE).priced_stages(base, copy=False)
    plan = replace(base, **dict(zip(change[::2], change[1::2])))
    memo = SharedStageMemo()
    before = [memo.held(base, k, stage) for k, stage in enumerate(stages)]  # the base's entries first
    after = [memo.held(plan, k, stage) for k, stage in enumerate(stages[: plan.pp])]
    assert after == [held(plan, k, stage) for k, stage in enumerate(stages[: plan.pp])]
    assert after != before[: plan.pp]  # the field is read: a memo keyed without it would have answered `before`


def test_the_moe_overlap_is_in_the_key():
    """One forward more in flight under 1F1B with the all-to-all overlapped (cost/moe/a2a_overlap.py)."""
    base = Plan(**{**BASE, "dp": 4}, ep=2, schedule="1f1b", virtual_stages=1, runtime="megatron")
    stages, _, _ = CostModel(GRAPH, PROFILE).priced_stages(replace(base, ep=1), copy=False)
    memo = SharedStageMemo()
    plain = memo.held(base, 0, stages[0])
    overlapped = memo.held(replace(base, moe_a2a_overlap=True), 0, stages[0])
    assert overlapped == held(replace(base, moe_a2a_overlap=True), 0, stages[0])
    assert overlapped[0] == plain[0] + 1


def test_block_facts_are_memoised_per_stage():
    model = CostModel(GRAPH, PROFILE)
    stages = [model.priced_stages(replace(_base(), tp=tp, devices=16 * tp), copy=False)[0][1] for tp in (1, 2)]
    memo = SharedStageMemo()
    assert [memo.blocks(s) for s in stages] == [block_facts(s) for s in stages]
    assert block_facts(stages[0]) != block_facts(stages[1])  # one stage's answer is not another's


def test_memory_through_the_memo_is_memory_priced_on_copies():
    search = Search(GRAPH, PROFILE, SearchOptions(devices=8, batch_size=16))
    search._beaten = lambda bound: False  # price every candidate
    search._usable_bytes = float("inf")  # whatever its memory floor
    priced = [c for c in search.run().candidates if c.cost is not None]
    assert {c.plan.schedule for c in priced if c.plan.pp > 1} >= {"1f1b", "interleaved_1f1b", "zbv"}
    model = search.cost_model
    for c in priced:
        alone = memory_alone(model, c.plan)  # the memo warm from the whole search
        runtime = model.for_runtime(c.plan.runtime)
        copies, _, _ = runtime.priced_stages(c.plan)
        assert alone.peak_memory_bytes == int(max(m.peak_bytes for m in runtime.stage_memory(c.plan, copies)))
