"""The planner chooses ZeRO-1's parameter all-gather under the next forward (``overlap_param_gather``,
execute/param_gather.py), priced by cost/dp/sync.py; ``--fix param_gather=on|off`` pins it."""

import pytest
from synthetic import synthetic_gpt, synthetic_profile

from autoplan.errors import PlanError
from autoplan.solve.api import plan_graph
from autoplan.solve.pins import parse_fixes


def _search(**fix):
    graph = synthetic_gpt(layers=4, hidden=256, heads=8, vocab=8000, seq=128, batch=16)
    return plan_graph(graph, devices=8, profile=synthetic_profile(), batch_size=16, fix=fix)


def test_zero1_plans_come_with_and_without_the_overlapped_gather_and_only_they_do():
    priced = [c for c in _search(zero=1, dp=8).candidates if c.plan is not None and c.cost is not None]
    assert {c.plan.overlap_param_gather for c in priced} == {False, True}
    assert all(c.plan.zero_stage == 1 and c.plan.ep == 1 for c in priced)
    by_config = {(c.plan.micro_batch_size, c.plan.recompute, c.plan.overlap_param_gather): c.cost for c in priced}
    pair = next(k for k in by_config if k[2] and (k[0], k[1], False) in by_config)
    assert by_config[pair].dp_comm_s != by_config[(pair[0], pair[1], False)].dp_comm_s  # priced apart, not copied
    others = [c.plan for c in _search(zero=2, dp=8).candidates if c.plan is not None]
    assert others and not any(p.overlap_param_gather for p in others)


def test_the_pin_narrows_the_choice_and_is_refused_beside_another_zero_stage():
    assert parse_fixes("param_gather=on") == {"param_gather": True}
    pinned = [c.plan for c in _search(zero=1, dp=8, param_gather=True).candidates if c.plan is not None]
    assert pinned and all(p.overlap_param_gather for p in pinned)
    with pytest.raises(PlanError, match="--fix param_gather=on overlaps ZeRO-1's weight all-gather"):
        _search(zero=2, param_gather=True)
    with pytest.raises(PlanError, match="--fix param_gather=maybe is not valid; expected on or off"):
        parse_fixes("param_gather=maybe")
