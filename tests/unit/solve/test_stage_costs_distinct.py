"""solve/stage_costs.py reads a block's time, re-run and bytes once per distinct summary (a group's identical blocks
share one, cost/blocks.py ``per_distinct``): the numbers are each block's own, in the graph's order, and the pure
functions behind them run once per group, not once per block, under every recompute."""

from __future__ import annotations

import pytest
from synthetic import a100_profile, gpt_graph

import autoplan.solve.stage_costs as stage_costs_module
from autoplan.cost import CostModel, block_time_s, kept_bytes, rerun_s
from autoplan.solve.stage_costs import StageCosts
from autoplan.types import Plan

LAYERS = 8


@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
def test_block_numbers_are_each_blocks_own_and_priced_once_per_summary(recompute, monkeypatch):
    model = CostModel(
        gpt_graph(layers=LAYERS, hidden=512, heads=8, seq_len=256, vocab=2048, batch_size=16), a100_profile()
    )
    plan = Plan(
        devices=4, dp=1, tp=1, pp=4, micro_batch_size=1, num_microbatches=8, precision="bf16", recompute=recompute
    )
    ctx = StageCosts(model.graph, model.profile, model).context(plan)
    blocks = model.block_summaries(plan.tp_plan, ctx, plan.tp_comm_overlap)
    calls = []
    for name in ("block_time_s", "rerun_s", "kept_bytes"):
        plain = getattr(stage_costs_module, name)
        monkeypatch.setattr(
            stage_costs_module, name, lambda *a, _f=plain, _n=name, **k: calls.append(_n) or _f(*a, **k)
        )
    costs = StageCosts(model.graph, model.profile, model)
    times, params, _, _ = costs._block_totals(plan, ctx)
    problem = costs.problem(plan)
    again = costs._rerun_times(plan, ctx)
    assert times == {layer: block_time_s(b, recompute) for layer, b in blocks.items()}
    assert params == {layer: b.param_count - b.expert_param_count for layer, b in blocks.items()}
    reruns = costs.partition_reruns(plan)
    assert problem.layer_time_s == [block_time_s(b, recompute, reruns) for b in blocks.values()]
    assert problem.layer_activation_bytes == [kept_bytes(b, recompute) for b in blocks.values()]
    assert again == ({layer: rerun_s(b, recompute) for layer, b in blocks.items()} if recompute != "none" else {})
    distinct = len({id(b) for b in blocks.values()})
    assert distinct < LAYERS  # identical blocks share a summary
    assert calls.count("block_time_s") == 2 * distinct  # the totals' and the partition's
    assert calls.count("kept_bytes") == distinct
    assert calls.count("rerun_s") == (distinct if recompute != "none" else 0)


def test_in_flight_is_read_once_per_schedule_and_is_each_plans_own(monkeypatch):
    """StageCosts.in_flight's memo keys on the schedule, pp, micro-batches, virtual stages and the all-to-all
    overlap: plans apart in anything else (ZeRO, dp, recompute, tp overlap, micro-batch size, precision) share it,
    and each gets in_flight_chunks' own numbers; in_flight_chunks runs once per key."""
    from autoplan.cost import in_flight_chunks

    model = CostModel(
        gpt_graph(layers=LAYERS, hidden=256, heads=8, seq_len=128, vocab=1024, batch_size=16), a100_profile()
    )
    calls = []
    monkeypatch.setattr(
        stage_costs_module, "in_flight_chunks", lambda plan, k: calls.append(k) or in_flight_chunks(plan, k)
    )
    costs = StageCosts(model.graph, model.profile, model)
    base = Plan(devices=8, dp=2, tp=1, pp=4, micro_batch_size=1, num_microbatches=8, precision="bf16").__dict__
    keyed = [
        dict(schedule=schedule, virtual_stages=v, num_microbatches=m, pp=pp, moe_a2a_overlap=a2a)
        for schedule, v in (("1f1b", 1), ("gpipe", 1), ("interleaved_1f1b", 2), ("zbv", 2), ("interleaved_zb", 2))
        for m in (4, 8)
        for pp in (2, 4)
        for a2a in (False, True)
    ]
    omitted = [{}, dict(zero_stage=1), dict(dp=1, devices=4), dict(recompute="full"), dict(tp_comm_overlap=True)]
    omitted += [dict(micro_batch_size=2), dict(precision="fp32")]
    for fields in keyed:
        for other in omitted:
            plan = Plan.unchecked(**{**base, **fields, **other})
            assert costs.in_flight(plan) == [in_flight_chunks(plan, k) for k in range(plan.pp)]
    assert len(calls) == sum(f["pp"] for f in keyed)  # once per key, each stage
