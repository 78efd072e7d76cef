"""The V schedules' halves built from their phases (cost/pp/v_orders.py ``v_halves``) are those of torch's order
(``v_order``, itself checked against torch's ``pipeline_order`` in test_v_schedules.py), half for half."""

from __future__ import annotations

import pytest

from autoplan.cost.pp.looped_orders import KINDS
from autoplan.cost.pp.v_orders import v_halves, v_order


def _halves_of(actions) -> list[tuple[str, int]]:
    """An order's halves, an F&B pair as its F, then its whole backward (cost/pp/order_states.py)."""
    out: list[tuple[str, int]] = []
    for action in actions:
        out += [("F", action[1]), ("BW", action[3])] if action[0] == "FB" else [(action[0], action[1])]
    return out


@pytest.mark.parametrize("schedule", ["zbv", "dualpipev"])
def test_v_halves_are_v_orders_on_every_rank(schedule):
    """Every rank of pp = 1..12 and m = 1..40 (fewer micro-batches than torch runs included: ZBV drops the
    actions of those beyond m), and of two long pipelines."""
    cases = [(pp, m) for pp in range(1, 13) for m in range(1, 41)] + [(16, 200), (32, 97)]
    for pp, m in cases:
        for rank, actions in enumerate(v_order(schedule, pp=pp, m=m)):
            kinds, chunks = v_halves(schedule, pp=pp, m=m, rank=rank)
            got = [(KINDS[k], c) for k, c in zip(kinds.tolist(), chunks.tolist())]
            assert got == _halves_of(actions), (schedule, pp, m, rank)
