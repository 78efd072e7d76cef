"""cost/pp/reruns.py counts a V schedule's split backwards in each rank's halves (v_orders.py ``v_halves``), not in
its actions (``v_order``, O(m) per rank), and keeps a plan's re-runs per chunk per the fields they read: both are
held to the plain count, the second over plans that differ in every other field."""

from __future__ import annotations

import types

import pytest

from autoplan.cost.pp import reruns
from autoplan.cost.pp.v_orders import v_order


def _actions_count(schedule: str, *, pp: int, m: int) -> tuple[int, ...]:
    """The plain count: each chunk's "B" actions in every rank's v_order."""
    counts = [0] * (2 * pp)
    for action in (a for rank in v_order(schedule, pp=pp, m=m) for a in rank):
        counts[action[1]] += action[0] == "B"
    return tuple(counts)


@pytest.mark.parametrize("schedule", ["zbv", "dualpipev"])
def test_split_backwards_are_the_actions_count_without_building_the_actions(schedule):
    shapes = [(pp, m) for pp in range(2, 9) for m in (1, 2, pp, 2 * pp - 1, 2 * pp, 3 * pp + 1, 37)] + [(4, 2000)]
    for pp, m in shapes:
        reruns.split_backwards.cache_clear()
        built = v_order.cache_info().misses
        found = reruns.split_backwards(schedule, pp=pp, m=m)
        assert v_order.cache_info().misses == built, (pp, m)  # no action list built for the count
        assert found == _actions_count(schedule, pp=pp, m=m), (pp, m)


def test_chunk_reruns_are_kept_per_schedule_pp_v_and_micro_batches():
    seen = {}
    for schedule, pp, v in [("1f1b", 4, 1), ("interleaved_zb", 4, 3), ("zbv", 4, 2), ("dualpipev", 3, 2)]:
        for m in (1, 8, 24):
            for recompute, dp, zero in [("full", 8, 1), ("selective", 2, 3), ("none", 1, 0)]:  # fields it reads not
                plan = types.SimpleNamespace(
                    schedule=schedule, pp=pp, virtual_stages=v, num_microbatches=m, recompute=recompute, dp=dp,
                    zero_stage=zero,
                )  # fmt: skip
                plain = tuple(
                    reruns.forward_reruns(schedule=schedule, pp=pp, num_microbatches=m, chunk=c) for c in range(pp * v)
                )
                found = reruns.chunk_forward_reruns(plan)
                assert found == plain, (schedule, pp, v, m)
                assert seen.setdefault((schedule, pp, v, m), found) is found  # kept, not counted again
