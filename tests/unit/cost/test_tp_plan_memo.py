"""The tp_plan memo (cost/tp/plan_memo.py): a plain dict is guarded by its contents, a FrozenTpPlan
(what the search's ILP hands out, solve/tp_plan.py) by its identity, and it cannot be edited."""

import copy
import json
import pickle

import pytest
from synthetic import synthetic_gpt, synthetic_profile

from autoplan.cost.tp.plan_memo import TpPlanMemo
from autoplan.errors import PlanError
from autoplan.solve.tp_plan import TPPlanner
from autoplan.types.frozen_tp_plan import FrozenTpPlan
from autoplan.types.plan import Plan


def _counting_memo():
    memo, made = TpPlanMemo(), []

    def get(tp_plan):
        return memo.get(("k",), tp_plan, lambda: made.append(dict(tp_plan)) or len(made))

    return get, made


def test_a_plain_dict_edited_in_place_is_priced_again():
    get, made = _counting_memo()
    tp_plan = {"h.0.attn": "colwise"}
    assert get(tp_plan) == get(tp_plan) == 1
    tp_plan["h.0.attn"] = "rowwise"
    assert get(tp_plan) == 2 and made[-1] == {"h.0.attn": "rowwise"}


def test_a_frozen_plan_hits_by_identity_and_refuses_every_edit():
    get, made = _counting_memo()
    frozen = FrozenTpPlan({"h.0.attn": "colwise"})
    assert get(frozen) == get(frozen) == 1 and len(made) == 1
    assert get(FrozenTpPlan(frozen)) == 2  # another object, even with equal contents: its own entry
    for edit in (
        lambda p: p.__setitem__("h.0.attn", "rowwise"),
        lambda p: p.update(x="rowwise"),
        lambda p: p.pop("h.0.attn"),
        lambda p: p.setdefault("x", "rowwise"),
        lambda p: p.clear(),
        lambda p: p.popitem(),
        lambda p: p.__delitem__("h.0.attn"),
    ):
        with pytest.raises(TypeError, match="cannot change"):
            edit(frozen)
    assert frozen == {"h.0.attn": "colwise"}


def test_a_frozen_plan_still_reads_writes_and_copies_as_a_dict():
    frozen = FrozenTpPlan({"h.0.mlp.c_fc": "colwise", "h.0.mlp.c_proj": "rowwise"})
    assert json.loads(json.dumps(frozen)) == dict(frozen)
    assert pickle.loads(pickle.dumps(frozen)) == frozen and type(pickle.loads(pickle.dumps(frozen))) is FrozenTpPlan
    assert copy.deepcopy(frozen) is frozen and copy.copy(frozen) is frozen
    editable = dict(frozen)
    editable["h.0.mlp.c_fc"] = "replicate"
    assert frozen["h.0.mlp.c_fc"] == "colwise"


def test_the_search_ilp_hands_out_frozen_tp_plans():
    graph = synthetic_gpt(layers=2, hidden=256, seq=64, batch=8)
    planner = TPPlanner(graph, synthetic_profile(), solver="highs")
    choice = planner.choose(dp=1, tp=2, pp=1, sequence_parallel=False, precision="bf16", micro_batch_size=1)
    assert type(choice.tp_plan) is FrozenTpPlan and choice.tp_plan


def test_a_plan_checks_a_frozen_plan_s_splits_as_a_dict_s():
    """Plan's check reads a FrozenTpPlan's splits once (FrozenTpPlan.splits), a dict's each time: the same verdict."""
    degrees = dict(devices=2, dp=1, tp=2, pp=1, micro_batch_size=1, num_microbatches=1)
    good = {"h.0.attn": "colwise", "h.0.mlp": "rowwise", "ln": "sequence_parallel", "wte": "replicate"}
    for tp_plan in (good, FrozenTpPlan(good), {}, FrozenTpPlan()):
        assert Plan(**degrees, tp_plan=tp_plan).tp_plan == tp_plan
    bad = {**good, "h.0.mlp": "diagonal"}
    for tp_plan in (bad, FrozenTpPlan(bad)):
        with pytest.raises(PlanError, match=r"tp_plan\['h.0.mlp'\]='diagonal'"):
            Plan(**degrees, tp_plan=tp_plan)
    assert FrozenTpPlan(bad).splits == {"colwise", "diagonal", "sequence_parallel", "replicate"}
