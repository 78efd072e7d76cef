"""Memos of the search's bounds keyed on fewer fields than they are asked with (cost/bounds.py): each field a key
omits is varied, and the memoised answer held to a fresh Bounds' (nothing memoised) for the same question."""

from __future__ import annotations

import itertools

import pytest
from synthetic import synthetic_gpt, synthetic_profile

from autoplan.cost import CostModel
from autoplan.cost import bounds as bounds_module
from autoplan.cost.bounds import Bounds
from autoplan.cost.cp.floor import cp_floor, kv_floor_s
from autoplan.solve.stage_costs import StageCosts


@pytest.fixture(scope="module")
def gqa_model():
    graph = synthetic_gpt(layers=2, hidden=256, heads=8, kv_heads=2, vocab=512, seq=1024, batch=8)
    return CostModel(graph, synthetic_profile())


def _bounds(model: CostModel) -> Bounds:
    return Bounds(model.graph, model.profile, StageCosts(model.graph, model.profile, model))


def test_the_kv_floor_memo_omits_fused_and_the_mesh_beyond_the_cp_group(gqa_model):
    """Bounds._kv_floor_s is keyed on (tp, precision, the cp rank's batch share, the cp floor): not on ``fused``,
    nor on dp and pp beyond the cp group they place. Asked in one order on one Bounds, each answer equals a fresh
    Bounds' asked once."""
    shared = _bounds(gqa_model)
    questions = list(itertools.product([False, True], [1, 2, 4], [1, 2], ["allgather", "ring"]))
    for fused, dp, pp, variant in questions + questions[::-1]:
        kw = dict(tp=1, precision="bf16", mbs=1, cp=2, cp_variant=variant, dp=dp, pp=pp, fused=fused)
        assert shared.compute_min_s(**kw) == _bounds(gqa_model).compute_min_s(**kw), kw
    on = dict(tp=1, precision="bf16", mbs=1, cp=2, dp=1, pp=1)
    assert shared.compute_min_s(**on, fused=True) < shared.compute_min_s(**on, fused=False)  # the ops part reads it


def test_the_kv_floor_prices_identical_attentions_messages_once(gqa_model, monkeypatch):
    """The K,V floor sums every attention's kv_floor_s in the graph's order, pricing the messages of attentions
    with equal inputs (kv_floor_inputs: every block's here) once."""
    graph, profile, times = gqa_model.graph, gqa_model.profile, gqa_model.node_times
    attentions = [n for n in graph.nodes if n.op == "attention"]
    assert len(attentions) == 2
    priced, real = [], bounds_module.kv_exposed_floor_s
    monkeypatch.setattr(bounds_module, "kv_exposed_floor_s", lambda *a, **k: priced.append(1) or real(*a, **k))
    for variant, tp in itertools.product(["allgather", "ring", "ulysses"], [1, 2]):
        floor = cp_floor(profile, dp=1, tp=tp, pp=1, cp=2, variant=variant)
        kw = dict(floor=floor, tp=tp, precision="bf16", f=1 / 8 / 2, times=times)
        expected = sum(kv_floor_s(n, graph, profile, **kw) for n in attentions)
        priced.clear()
        got = _bounds(gqa_model)._kv_floor_s(tp=tp, precision="bf16", f=1 / 8 / 2, cp=floor)
        assert got == expected > 0 and len(priced) == 1, (variant, tp)
