"""StageCosts.param_parts and sync_params read the blocks' parameter counts once per tp_plan, floor context and
tp overlap (``_param_counts``), not once per recompute too: a parameter count reads no recompute. Plans apart
in their recompute alone get the counts summed and least from the block summaries, and the summaries are read
once for all of them."""

from __future__ import annotations

from dataclasses import replace

import pytest
from synthetic import a100_profile, gpt_graph

from autoplan.cost import CostModel
from autoplan.solve.stage_costs import StageCosts
from autoplan.types import Plan


@pytest.fixture(scope="module")
def model():
    graph = gpt_graph(layers=4, hidden=256, heads=8, seq_len=128, vocab=1024, batch_size=16)
    return CostModel(graph, a100_profile())


def _plain(model: CostModel, costs: StageCosts, plan: Plan) -> tuple:
    ctx = costs.floor_context(plan)
    blocks = model.block_summaries(plan.tp_plan, ctx, plan.tp_comm_overlap)
    pre, post = model.outside_summaries(plan.tp_plan, ctx, plan.tp_comm_overlap)
    dense = [b.param_count - b.expert_param_count for b in blocks.values()]
    return (pre.param_count, post.param_count, sum(dense)), (pre.param_count, min([*dense, post.param_count]))


@pytest.mark.parametrize("tp", [1, 2])
def test_counts_are_the_summaries_and_read_once_per_recompute_choices(model, tp, monkeypatch):
    base = Plan(devices=4 * tp, dp=1, tp=tp, pp=4, micro_batch_size=1, num_microbatches=8, precision="bf16")
    plans = [replace(base, recompute=recompute) for recompute in ("none", "selective", "full")]
    costs = StageCosts(model.graph, model.profile, model)
    read, plain = [], model.block_summaries
    monkeypatch.setattr(model, "block_summaries", lambda *a, **k: read.append(1) or plain(*a, **k))
    for plan in plans:
        parts, sync = costs.param_parts(plan), costs.sync_params(plan)
        assert (parts, sync) == _plain(model, costs, plan)
    assert len(read) == 1 + len(plans)  # the memo's one read, and _plain's per plan
