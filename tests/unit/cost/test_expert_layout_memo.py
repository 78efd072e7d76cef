"""cost/moe/experts.py ``block_experts`` keeps a block's MoE layers, expert GEMMs, parameter names and modules per
tuple of nodes (they read the graph and the nodes alone): under every placement field, precision and micro-batch it
gives what another tuple of the same nodes gives, finds them once per tuple, and prices a list afresh."""

from __future__ import annotations

from dataclasses import replace

import pytest
from synthetic import synthetic_profile
from synthetic.moe import mixtral_graph

from autoplan.cost.moe import experts as experts_module
from autoplan.cost.moe.experts import ExpertPlacement, block_experts
from autoplan.cost.network.mesh import AxisGroup
from autoplan.cost.tp.block import block_nodes

pytest.importorskip("transformers")

BASE = ExpertPlacement(ep=2, imbalance=1.25, group=AxisGroup(size=2, ranks_per_node=2))
PLACEMENTS = [
    BASE,
    replace(BASE, ep=4, group=AxisGroup(size=4, ranks_per_node=2)),
    replace(BASE, imbalance=1.0),
    replace(BASE, etp=2, etp_group=AxisGroup(size=2, ranks_per_node=1)),
    replace(BASE, tokens=0.5),
]


def test_the_layout_is_the_graphs_whatever_the_placement_and_found_once_per_nodes(monkeypatch):
    graph, profile = mixtral_graph(), synthetic_profile()
    nodes = tuple(block_nodes(graph, graph.layers[0]))
    found = []
    plain = experts_module.layers_in
    monkeypatch.setattr(experts_module, "layers_in", lambda g, n: found.append(1) or plain(g, n))
    for place in PLACEMENTS:
        for precision, fraction in (("bf16", 1 / 8), ("fp32", 1 / 2)):
            kw = dict(precision=precision, batch_fraction=fraction, place=place)
            kept = block_experts(graph, nodes, profile, **kw)
            fresh = block_experts(graph, tuple(block_nodes(graph, graph.layers[0])), profile, **kw)  # a new tuple
            assert kept == fresh and kept.gemms, (place, precision)
    assert len(found) == 1 + len(PLACEMENTS) * 2  # this tuple's once; each new tuple's once
    listed = list(nodes)
    assert block_experts(graph, listed, profile, precision="bf16", batch_fraction=1 / 8, place=BASE) == block_experts(
        graph, nodes, profile, precision="bf16", batch_fraction=1 / 8, place=BASE
    )
    assert len(found) == 2 + len(PLACEMENTS) * 2  # a list is not kept
    assert block_experts(graph, nodes, profile, precision="bf16", batch_fraction=1 / 8, place=None) is None
