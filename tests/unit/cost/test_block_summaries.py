"""cost/summaries.py prices a block once per what its summary reads: the nodes outside every block of an MoE model
run no routed experts, so one summary of them serves every expert placement and is what summarise gives under each;
a block that runs experts is priced per placement; and every block of a group with the same splits shares one."""

from __future__ import annotations

import pytest
from synthetic import synthetic_profile
from synthetic.moe import mixtral_graph

from autoplan.cost.blocks import summarise
from autoplan.cost.model import CostModel
from autoplan.cost.summaries import part_context
from autoplan.types.plan import Plan

pytest.importorskip("transformers")


def _plan(ep: int) -> Plan:
    return Plan(devices=8, dp=8, tp=1, pp=1, ep=ep, micro_batch_size=4, num_microbatches=1, precision="bf16")


@pytest.fixture(scope="module")
def model():
    return CostModel(mixtral_graph(), synthetic_profile())


def test_the_outside_nodes_are_priced_once_for_every_expert_placement(model):
    contexts = [model.tp_context(_plan(ep)) for ep in (1, 2, 8)]
    assert len({ctx.key for ctx in contexts}) == 3 and len({ctx.dense_key for ctx in contexts}) == 1
    for part in ("pre", "post"):
        shared = [model.block_summary(None, {}, ctx, part) for ctx in contexts]
        assert all(summary is shared[0] for summary in shared)
        for ctx in contexts:  # what summarise itself gives under each placement ("pre" charges no TP: tp = 1)
            fresh = summarise(
                model.graph,
                model.summaries.outside[part],
                layer=None,
                tp_plan={},
                ctx=part_context(ctx, part),
                node_times=model.node_times,
            )
            assert fresh == shared[0]


def test_a_block_that_runs_experts_is_priced_per_placement(model):
    contexts = [model.tp_context(_plan(ep)) for ep in (2, 8)]
    layer = model.graph.layers[0]
    one, other = (model.block_summary(layer, {}, ctx) for ctx in contexts)
    assert one.expert_param_count == 4 * other.expert_param_count > 0  # 1/ep of the experts each
    blocks = model.block_summaries({}, contexts[0], False)
    assert all(blocks[layer] is one for layer in model.graph.layers)  # the group's copies share it
