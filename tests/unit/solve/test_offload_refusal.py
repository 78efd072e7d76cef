"""solve/activation_offload.py ``_offloaded`` refuses at once (types/activation_offload.py ``offload_refusal``)
the plans whose offloaded copy the checks refuse, without building that copy: on plans that vary every field the
offload rule reads (tp, cp, ep, compile, recompute and its budget, runtime), it answers as the checked copy does."""

from __future__ import annotations

import itertools
from dataclasses import replace

from autoplan.errors import PlanError
from autoplan.solve.activation_offload import _offloaded
from autoplan.types import Plan
from autoplan.types.activation_offload import check_activation_offload, offload_refusal


def _checked_copy(plan: Plan) -> Plan | None:
    """The offloaded copy through every check (what ``_offloaded`` answered before its refusal)."""
    try:
        return replace(plan, offload_activations=True)
    except PlanError:
        return None


def _plans() -> list[Plan]:
    plans = []
    degrees = [dict(tp=1, cp=1, ep=1), dict(tp=2, cp=1, ep=1), dict(tp=1, cp=2, ep=1), dict(tp=1, cp=1, ep=2)]
    recomputes = [("none", []), ("full", []), ("full", [1, 1]), ("selective", []), ("selective", [2, 0])]
    for deg, compile_, (recompute, blocks), runtime in itertools.product(
        degrees, (False, True), recomputes, ("autoplan", "megatron", "torchtitan")
    ):
        dp = 8 // (deg["tp"] * deg["cp"] * 2)
        fields = dict(devices=8, dp=dp, pp=2, micro_batch_size=1, num_microbatches=4, recompute=recompute, **deg)
        try:
            plans.append(Plan(**fields, compile=compile_, runtime=runtime, recompute_blocks=blocks))
        except PlanError:
            continue  # a plan the other rules refuse: never in the search
    return plans


def test_offloaded_answers_as_the_checked_copy():
    plans = _plans()
    assert len(plans) > 20 and any(_checked_copy(p) for p in plans) and not all(_checked_copy(p) for p in plans)
    for plan in plans:
        ours, checked = _offloaded(plan), _checked_copy(plan)
        assert (ours is None) == (checked is None), plan.describe()
        assert ours is None or ours == checked


def test_the_refusal_is_the_rule_check_activation_offload_raises_on():
    for plan in _plans():
        offloaded = Plan.unchecked(**{**plan.__dict__, "offload_activations": True})
        try:
            check_activation_offload(offloaded)
            raised = False
        except PlanError:
            raised = True
        assert raised == (offload_refusal(plan) is not None), plan.describe()
