"""Which HSDP splits the search offers and pins (autoplan/solve/hsdp.py, solve/space.py)."""

from __future__ import annotations

import pytest
from synthetic import synthetic_gpt, synthetic_profile

from autoplan.errors import PlanError
from autoplan.solve.api import plan_graph
from autoplan.solve.hsdp import replicate_options
from autoplan.solve.pins import parse_fixes


def _replicas(**changes) -> list[int]:
    fields = dict(dp=16, tp=1, ep=1, cp=1, zero=3, per_node=8, runtime="autoplan", fixes={})
    fields.update(changes)
    return replicate_options(**fields)


def test_full_sharding_and_a_shard_group_of_a_node_are_offered():
    assert _replicas() == [1, 2]  # S = 8 = one node of dp ranks
    assert _replicas(tp=2, dp=16) == [1, 4]  # a node holds 4 dp ranks of tp = 2
    assert _replicas(tp=8, dp=128) == [1, 64]  # tp fills the node: the smallest S >= 2 spans two
    assert _replicas(dp=8) == [1]  # the dp ranks fit one node: nothing to replicate across


@pytest.mark.parametrize(
    "changes", [dict(zero=0), dict(ep=2), dict(runtime="deepspeed"), dict(runtime="torchtitan", zero=1)]
)
def test_hsdp_is_offered_only_where_it_runs(changes):
    assert _replicas(**changes) == [1]


def test_beside_cp_a_shard_group_is_a_nodes_dp_x_cp_ranks():
    assert _replicas(cp=2) == [1, 4]  # S x cp = 4 x 2 = one node of 8
    assert _replicas(cp=8, dp=4) == [1, 4]  # cp fills the node: S = 1, the replicas shard over cp alone
    assert _replicas(cp=2, fixes=parse_fixes("dp_replicate=16")) == [16]  # S = 1 x cp 2 still shards


def test_a_pin_keeps_only_itself_where_it_is_legal():
    pin = parse_fixes("dp_replicate=4")
    assert pin == {"dp_replicate": 4}
    assert _replicas(fixes=pin) == [4] and _replicas(fixes=pin, zero=0) == []
    assert _replicas(fixes=parse_fixes("dp_replicate=1")) == [1]


@pytest.fixture(scope="module")
def graph():
    return synthetic_gpt(layers=4, hidden=512, heads=8, vocab=1024, seq=256, batch=32)


def test_a_pinned_split_comes_out_in_the_plan(graph):
    result = plan_graph(graph, devices=16, profile=synthetic_profile(), batch_size=32, fix="dp=16,dp_replicate=2")
    assert result.best.dp_replicate == 2 and result.best.zero_stage >= 1
    assert result.best.to_dict()["dp_replicate"] == 2


def test_a_pin_no_plan_can_take_is_refused_in_one_sentence(graph):
    with pytest.raises(PlanError, match="HSDP replicates ZeRO-sharded states"):
        plan_graph(graph, devices=16, profile=synthetic_profile(), batch_size=32, fix="dp_replicate=2,zero=0")
