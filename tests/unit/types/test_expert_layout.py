"""The experts' own layout, expert_tp x ep x edp beside tp x cp x dp (autoplan/types/expert_layout.py):
its rules, its groups, and that plans at its default are written as before."""

import pytest

from autoplan.errors import PlanError
from autoplan.types.expert_layout import expert_dp, experts_apart, token_share
from autoplan.types.layout import expert_groups
from autoplan.types.plan import Plan


def _plan(**overrides):
    fields = dict(devices=4, dp=2, tp=2, pp=1, micro_batch_size=1, num_microbatches=1, sequence_parallel=True)
    fields.update(overrides)
    return Plan(**fields)


def test_tp_beside_ep_folds_the_experts_over_the_tp_ranks():
    plan = _plan(ep=2)
    assert experts_apart(plan) and expert_dp(plan) == 2 and token_share(plan) == 0.5
    assert "ep=2 tp=2" in plan.describe()
    both = _plan(ep=2, expert_tp=2)
    assert expert_dp(both) == 1 and "etp=2" in both.describe()
    assert Plan.from_dict(both.to_dict()) == both


def test_the_default_layout_is_todays():
    plan = _plan()
    assert not experts_apart(plan) and expert_dp(plan) == 2
    assert "expert_tp" not in plan.to_dict()  # plan.json stays byte-identical at the default
    assert expert_dp(_plan(dp=4, tp=1, ep=2, devices=4, sequence_parallel=False)) == 2  # tp = 1: dp / ep


@pytest.mark.parametrize(
    ("overrides", "words"),
    [
        (dict(ep=2, sequence_parallel=False), "needs sequence_parallel=true"),
        (dict(ep=4, expert_tp=2), "ep=4 x expert_tp=2 must divide dp*cp*tp=4"),
        (dict(expert_tp=0), "expert_tp=0; expected an integer >= 1"),
        (dict(dp=1, cp=2, expert_tp=2), "context parallelism does not compose with the experts' own layout"),
    ],
)
def test_bad_layouts_are_one_sentence(overrides, words):
    with pytest.raises(PlanError) as info:
        _plan(**overrides)
    assert words in str(info.value)


def test_expert_groups_lay_etp_innermost_then_ep_then_edp():
    """Megatron-Core's expert RankGenerator (order tp-ep-dp) over a stage's dp x tp ranks."""
    groups = expert_groups(pp=1, dp=2, tp=4, ep=2, expert_tp=2)
    assert groups["etp"] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert groups["ep"] == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert groups["edp"] == [[0, 4], [1, 5], [2, 6], [3, 7]]
    folded = expert_groups(pp=2, dp=2, tp=2, ep=2)  # expert_tp = 1: an ep group is a tp group here
    assert folded["ep"] == [[0, 1], [2, 3], [4, 5], [6, 7]] and folded["edp"][0] == [0, 2]
    assert expert_groups(pp=1, dp=4, ep=2)["ep"] == [[0, 1], [2, 3]]  # tp = 1: as before


def test_exports_without_expert_tensor_parallelism_name_the_layout_they_cannot_write():
    """torchtitan 0.3, DeepSpeed and Accelerate have no expert tensor parallelism: each export names it
    (Megatron-LM writes it: tests/unit/export/test_megatron.py)."""
    from autoplan.export.api import export_plan

    folded = _plan(ep=2, zero_stage=1, routing={"imbalance": 1.25})
    for framework, words in (("torchtitan", "torchtitan 0.3's config"), ("deepspeed", "DeepSpeed's config"),
                             ("accelerate", "Accelerate's config has no expert")):  # fmt: skip
        said = " ".join(export_plan(folded, to=framework).unexpressed)
        assert "expert_tp=1" in said and words in said, (framework, said)
    plain = _plan(dp=4, tp=1, devices=4, ep=2, sequence_parallel=False, zero_stage=1)
    assert "expert tensor" not in " ".join(export_plan(plain, to="deepspeed").unexpressed)
