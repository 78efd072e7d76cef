"""cost/node_terms.py: a routed block's node terms are priced once per context without the expert placement, and
only its routed experts' nodes again per placement. Each field of the placement the memo leaves out is changed
in turn: the summary from terms priced under another placement must equal summarise's own under the new one, every
expert GEMM must be among the nodes priced again, and through the cost model's memo a block's summary must equal a
fresh cost model's."""

from __future__ import annotations

from dataclasses import fields, replace

import pytest
from synthetic import synthetic_profile
from synthetic.moe import mixtral_graph

from autoplan.cost import node_terms as node_terms_module
from autoplan.cost.blocks import summarise
from autoplan.cost.model import CostModel
from autoplan.cost.moe.experts import block_experts
from autoplan.cost.network.mesh import AxisGroup
from autoplan.cost.node_terms import block_terms, node_terms
from autoplan.types.plan import Plan

pytest.importorskip("transformers")

#: another value of each ExpertPlacement field, each one the block's price reads
OTHER = {
    "ep": 4,
    "imbalance": 1.37,
    "group": AxisGroup(size=2, ranks_per_node=1),
    "etp": 2,
    "etp_group": AxisGroup(size=2, ranks_per_node=1),
    "tokens": 0.5,
    "weights_combined": False,
}


@pytest.fixture(scope="module")
def model():
    return CostModel(mixtral_graph(), synthetic_profile())


def _ctx(model, *, tp: int = 1, ep: int = 2):
    kw = dict(micro_batch_size=4, num_microbatches=1, precision="bf16", sequence_parallel=tp > 1)
    return model.tp_context(Plan(devices=8, dp=8 // tp, tp=tp, pp=1, ep=ep, **kw))


def test_every_field_of_the_placement_is_named():
    from autoplan.cost.moe.experts import ExpertPlacement

    assert set(OTHER) == {f.name for f in fields(ExpertPlacement)}


@pytest.mark.parametrize("field", sorted(OTHER))
def test_terms_priced_under_one_placement_serve_another(model, field):
    base = _ctx(model)
    moved = replace(base, experts=replace(base.experts, **{field: OTHER[field]}))
    layer = model.graph.layers[0]
    structure = model.summaries.structures[layer]
    kw = dict(layer=layer, tp_plan={}, node_times=model.node_times)
    terms = block_terms(model.graph, structure.nodes, ctx=base, **kw)
    assert terms.routed  # the block runs routed experts: its expert nodes are priced per placement
    fresh = summarise(model.graph, structure, ctx=moved, **kw)
    assert summarise(model.graph, structure, ctx=moved, terms=terms, **kw) == fresh
    if field != "etp_group":  # the etp group is read only at etp > 1
        assert fresh != summarise(model.graph, structure, ctx=base, **kw)
    # no expert GEMM is left out of the routed nodes: each other node prices the same as one under the new placement
    experts = block_experts(
        model.graph, structure.nodes, model.profile, precision="bf16", batch_fraction=1 / 8, place=moved.experts
    )
    assert experts.gemms and set(experts.gemms) <= {structure.nodes[i].name for i in terms.routed}
    for i, node in enumerate(structure.nodes):
        as_gemm = node_terms(terms, node, ctx=moved, gemm=experts.gemms.get(node.name), busiest=1.0)[0]
        assert i in terms.routed or as_gemm == terms.terms[i], node.name


def test_the_memo_gives_what_a_fresh_cost_model_gives(model):
    contexts = [_ctx(model, ep=ep) for ep in (1, 2, 8)] + [_ctx(model, tp=2, ep=2)]
    contexts += [replace(c, experts=replace(c.experts, imbalance=1.5)) for c in contexts[1:]]
    tp_plan = {}
    for ctx in contexts:  # one cost model prices them all, sharing terms; each fresh one prices one
        fresh = CostModel(model.graph, model.profile)
        for layer in model.graph.layers:
            assert model.block_summary(layer, tp_plan, ctx) == fresh.block_summary(layer, tp_plan, ctx)


@pytest.mark.parametrize("field", sorted(OTHER))
def test_routed_nodes_terms_kept_per_busiest_share_serve_another_placement(model, field, monkeypatch):
    """BlockTerms.sums keeps the terms of a routed node that is no expert GEMM per busiest rank's share, all of the
    placement they read: after one placement, a placement that changes ``field`` prices again its expert GEMMs alone
    where that share stays, every routed node where it moves, and sums what fresh terms sum."""
    base = _ctx(model)
    moved = replace(base, experts=replace(base.experts, **{field: OTHER[field]}))
    layer = model.graph.layers[0]
    structure = model.summaries.structures[layer]
    kw = dict(layer=layer, tp_plan={}, node_times=model.node_times)
    terms, fresh = (block_terms(model.graph, structure.nodes, ctx=base, **kw) for _ in range(2))
    share = {
        c: block_experts(model.graph, structure.nodes, model.profile, precision="bf16", batch_fraction=1 / 8, place=p)
        for c, p in (("base", base.experts), ("moved", moved.experts))
    }
    summarise(model.graph, structure, ctx=base, terms=terms, **kw)
    priced, real = [], node_terms_module.node_terms
    monkeypatch.setattr(node_terms_module, "node_terms", lambda *a, **k: priced.append(1) or real(*a, **k))
    got = terms.sums(moved, share["moved"])
    gemms = sum(1 for i in terms.routed if structure.nodes[i].name in share["moved"].gemms)
    assert len(priced) == (gemms if share["moved"].imbalance == share["base"].imbalance else len(terms.routed))
    assert got == fresh.sums(moved, share["moved"])
