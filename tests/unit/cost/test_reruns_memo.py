"""cost/pp/reruns.py's memos against the plain computation: ``split_backwards`` counted from the halves
(v_orders.py ``v_halves``) against v_order's actions one at a time, and ``chunk_forward_reruns`` /
``plan_forward_reruns`` (memoised per schedule, pp, v and m) against ``forward_reruns`` on plans that vary
every field it reads, asked one after the other so a memo keyed on too little would answer from the wrong entry."""

from __future__ import annotations

import types

import pytest

from autoplan.cost.pp.reruns import chunk_forward_reruns, forward_reruns, plan_forward_reruns, split_backwards
from autoplan.cost.pp.v_orders import v_order


def _split_by_actions(schedule: str, *, pp: int, m: int) -> tuple[int, ...]:
    counts = [0] * (2 * pp)
    for action in (a for rank in v_order(schedule, pp=pp, m=m) for a in rank):
        if action[0] == "B":
            counts[action[1]] += 1
    return tuple(counts)


@pytest.mark.parametrize("schedule", ["zbv", "dualpipev"])
def test_split_backwards_counts_v_orders_b_actions(schedule):
    for pp in range(1, 9):
        for m in [*range(1, 3 * pp + 2), 40, 97]:
            assert split_backwards(schedule, pp=pp, m=m) == _split_by_actions(schedule, pp=pp, m=m), (pp, m)


def _plan(schedule: str, pp: int, v: int, m: int):
    return types.SimpleNamespace(schedule=schedule, pp=pp, virtual_stages=v, num_microbatches=m)


CASES = [
    (schedule, pp, v, m)
    for schedule, v in [
        ("1f1b", 1),
        ("gpipe", 1),
        ("interleaved_1f1b", 2),
        ("interleaved_zb", 2),
        ("interleaved_zb", 3),
        ("zbv", 2),
        ("dualpipev", 2),
    ]  # fmt: skip
    for pp in (2, 3, 4)
    for m in (pp, 2 * pp + 1, 3 * pp, 5 * pp + 2)
]


def test_chunk_forward_reruns_are_forward_reruns_of_each_plan_asked_in_turn():
    for schedule, pp, v, m in CASES + CASES[::-1]:  # each key met again after the others
        plan = _plan(schedule, pp, v, m)
        plain = tuple(forward_reruns(schedule=schedule, pp=pp, num_microbatches=m, chunk=c) for c in range(pp * v))
        assert chunk_forward_reruns(plan) == plain, (schedule, pp, v, m)
        assert [plan_forward_reruns(plan, c) for c in range(pp * v)] == list(plain)


def test_plan_forward_reruns_past_the_chunks_is_forward_reruns():
    plan = _plan("interleaved_zb", 2, 2, 4)
    assert plan_forward_reruns(plan, 7) == forward_reruns(schedule="interleaved_zb", pp=2, num_microbatches=4, chunk=7)


def test_plans_apart_only_in_fields_reruns_do_not_read_share_one_answer():
    """The memo's key omits every other plan field (ZeRO, recompute, tp, ...): plans apart only in them get the same
    (held) tuple, the plain computation's."""
    first = types.SimpleNamespace(**vars(_plan("dualpipev", 4, 2, 11)), zero_stage=0, recompute="full", tp=2)
    second = types.SimpleNamespace(**vars(_plan("dualpipev", 4, 2, 11)), zero_stage=3, recompute="selective", tp=8)
    plain = tuple(forward_reruns(schedule="dualpipev", pp=4, num_microbatches=11, chunk=c) for c in range(8))
    assert chunk_forward_reruns(first) is chunk_forward_reruns(second)
    assert chunk_forward_reruns(second) == plain
