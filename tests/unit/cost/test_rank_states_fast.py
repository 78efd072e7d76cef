"""The pipeline-memory states computed at once (cost/pp/order_states.py, looped_orders.py ``looped_halves``, the
blocked frontier) are the walk's, state for state and in the same order, so the peak a price picks, ties
included, is the one the walk picks (docs/cost-model.md, "Pipeline memory")."""

from __future__ import annotations

import random

import numpy as np
import pytest

from autoplan.cost.pp import rank_memory
from autoplan.cost.pp.looped_orders import KINDS, looped_halves, looped_order
from autoplan.cost.pp.order_states import _most_sent, distinct_rows
from autoplan.cost.pp.rank_memory import frontier, peak_state, rank_states, rank_states_walk, row_matrix
from autoplan.cost.pp.replay import held_at_peak, held_states
from autoplan.types.schedules import V_SCHEDULES, zero_bubble_rounds

VIRTUAL = {"interleaved_1f1b": (2, 3), "interleaved_zb": (1, 2, 3), "zbv": (2,), "dualpipev": (2,)}


def _runs(schedule: str, pp: int, m: int) -> bool:
    """Whether torch runs ``schedule`` with ``pp`` stages and ``m`` micro-batches (types/schedules.py)."""
    if schedule in V_SCHEDULES:
        return m >= 2 * pp
    rounds_divide = m % zero_bubble_rounds(pp=pp, num_microbatches=m) == 0
    return rounds_divide and (m >= pp or schedule == "interleaved_1f1b")


def _grid() -> list[dict]:
    """Every (schedule, pp <= 16, v <= 3, m <= 64, rank) torch runs."""
    return [
        dict(schedule=schedule, pp=pp, virtual_stages=v, m=m, rank=rank)
        for schedule, vs in VIRTUAL.items()
        for pp in range(2, 17)
        for v in vs
        for m in range(1, 65)
        if _runs(schedule, pp, m)
        for rank in range(pp)
    ]


def test_the_states_are_the_walks_on_every_schedule_torch_runs():
    """A fixed sample of the grid (the whole grid, about 25,000 ranks, takes half a minute), and every rank of
    the largest pipelines, where the warm-up and cool-down phases are longest."""
    grid = _grid()
    cases = random.Random(0).sample(grid, 600) + [c for c in grid if c["pp"] == 16 and c["m"] in (16, 33, 64)]
    for case in cases:
        assert rank_states(**case) == rank_states_walk(**case), case


def test_the_peak_and_its_ties_are_the_walks():
    """Weights that tie states (whole groups weighing nothing, equal weights) pick the same state, from the
    states or from their memoised matrix."""
    case = dict(schedule="interleaved_zb", pp=4, virtual_stages=3, m=8, rank=1)
    fast, walk = rank_states(**case), rank_states_walk(**case)
    for weights in ([1, 1, 1], [0, 1, 0], [1, 0, 0], [2, 2, 2]):
        prices = dict(saved_bytes=weights, kept_bytes=weights[::-1], boundary_bytes=0.0, grad_bytes=0.0, loss_bytes=0.0)
        assert peak_state(fast, **prices) == peak_state(walk, **prices)
        rows, matrix = row_matrix(**case)
        assert peak_state(rows, **prices, matrix=matrix) == peak_state(walk, **prices)


def test_the_peak_of_the_rows_is_the_frontiers_ties_included():
    """The price weighs a rank's rows without their frontier (rank_memory.py ``row_matrix``): the state it picks
    is the one the frontier's first state holding the most would be, under weights that tie many rows (zeros,
    equal weights) and without ties, merged (D_g = D) or not."""
    grid = _grid()
    cases = random.Random(2).sample(grid, 200) + [c for c in grid if c["pp"] == 8 and c["m"] == 32]
    for case in cases:
        for merged in (False, True):
            rows, matrix = row_matrix(**case, merged=merged)
            states, g = rank_states(**case, merged=merged), (rows.shape[1] - 2 - (not merged)) // 2
            for saved, kept, boundary, loss in [(1.0, 0.0, 0.0, 0.0), (0.0, 1.0, 1.0, 0.0), (1.0, 1.0, 1.0, 1.0),
                                                (3.0, 0.5, 2.0, 0.0), (1.25, 0.75, 0.0, 4.0)]:  # fmt: skip
                prices = dict(saved_bytes=[saved] * g, kept_bytes=[kept] * g, boundary_bytes=boundary,
                              grad_bytes=boundary if merged else boundary / 2, loss_bytes=loss)  # fmt: skip
                assert peak_state(rows, **prices, matrix=matrix) == peak_state(states, **prices), (case, prices)


@pytest.mark.parametrize("seed", range(6))
def test_the_frontier_keeps_exactly_the_states_none_exceeds_on_random_sets(seed, frontier_path):
    """Kept states are distinct and none is at most another; every given state is at most a kept one."""
    rng = np.random.default_rng(seed)
    count, width = [(5, 2), (70, 3), (200, 8), (300, 4), (1, 6), (130, 5)][seed]
    states = [tuple(int(n) for n in row) for row in rng.integers(0, 6, size=(count, width))]
    states += states[: count // 3]  # repeats
    kept = frontier(states)
    assert list(kept) == sorted(set(kept))
    assert not any(a != b and all(x <= y for x, y in zip(a, b)) for a in kept for b in kept)
    assert all(any(all(x <= y for x, y in zip(s, k)) for k in kept) for s in states)


@pytest.fixture(params=["pairs", "by_sum"])
def frontier_path(request, monkeypatch):
    """Both of rank_memory.frontier's tests: all pairs, or by falling sum (``_PAIRS_AT_MOST`` 0)."""
    if request.param == "by_sum":
        monkeypatch.setattr(rank_memory, "_PAIRS_AT_MOST", 0)
    return request.param


@pytest.mark.parametrize("count, width", [(3, 1), (90, 7), (150, 8), (140, 9), (200, 16), (70, 17), (700, 6)])
def test_the_frontier_is_the_pairwise_definitions_at_every_width(count, width, frontier_path):
    """The frontier, read by falling sum a block at a time against those kept (rank_memory.py), keeps exactly the
    distinct states no other is at least in every count, in sorted order, at any width, over several blocks."""
    rng = np.random.default_rng(count)
    states = [tuple(int(n) for n in row) for row in rng.integers(0, 4, size=(count, width))]
    distinct = set(states)
    plain = sorted(s for s in distinct if not any(s != t and all(x <= y for x, y in zip(s, t)) for t in distinct))
    assert frontier(states) == tuple(plain)


@pytest.mark.parametrize("total", [6, 40])
def test_a_frontier_wider_than_a_block_is_kept_whole(total, frontier_path):
    """States of one sum exceed none of each other, so all are kept, over more blocks than one; states under
    them (a count less) are exceeded: the falling-sum order never keeps a state before its exceeder."""
    rng = np.random.default_rng(total)
    top = {(a, b, total - a - b) for a in range(total + 1) for b in range(total + 1 - a)}
    under = {tuple(max(0, n - int(d)) for n, d in zip(s, rng.integers(1, 3, size=3))) for s in top}
    states = list(under | top)
    rng.shuffle(states)
    distinct = set(states)
    plain = sorted(s for s in distinct if not any(s != t and all(x <= y for x, y in zip(s, t)) for t in distinct))
    assert frontier(states) == tuple(plain) and len(plain) >= len(top)


def test_looped_halves_are_the_looped_orders_kinds_and_chunks():
    for schedule in ("interleaved_1f1b", "interleaved_zb"):
        for pp, v, m in [(2, 1, 2), (3, 2, 7), (4, 3, 8), (4, 2, 12), (5, 3, 10), (8, 2, 64), (6, 3, 1)]:
            if schedule == "interleaved_1f1b" and v == 1:
                continue
            for rank, order in enumerate(looped_order(schedule, pp=pp, virtual_stages=v, m=m)):
                kinds, chunks = looped_halves(schedule, pp=pp, virtual_stages=v, m=m, rank=rank)
                assert [(KINDS[k], c) for k, c in zip(kinds.tolist(), chunks.tolist())] == [a[:2] for a in order]


@pytest.mark.parametrize("high", [4, 2**40, -3])
def test_distinct_rows_are_numpys_unique_rows(high):
    """The mixed-radix path, and numpy's own where the radix overflows or a count is negative."""
    rng = np.random.default_rng(1)
    rows = rng.integers(min(0, high), max(1, high), size=(50, 3))
    rows = np.concatenate([rows, rows[:10]])
    assert np.array_equal(distinct_rows(rows), np.unique(rows, axis=0))


@pytest.mark.parametrize("high", [4, 2**40, -3])
@pytest.mark.parametrize("sent", [0, 2, 4])
def test_most_sent_keeps_the_rows_most_sent_per_counts_in_their_order(high, sent):
    """order_states.py ``_most_sent`` by sorting packed rows (and numpy's rows where they do not pack), against its
    definition: of the rows equal but in column ``sent``, the one with the most, ordered by the other counts."""
    rng = np.random.default_rng(2)
    rows = rng.integers(min(0, high), max(1, high), size=(80, 5))
    rows = np.concatenate([rows, rows[:10], rows[10:30] * [1, 1, 1, 1, 0] + [0, 0, 0, 0, 1]])  # ties, other sents
    most: dict[tuple, int] = {}
    for row in rows.tolist():
        counts = (*row[:sent], *row[sent + 1 :])
        most[counts] = max(most.get(counts, row[sent]), row[sent])
    expected = [(*counts[:sent], n, *counts[sent:]) for counts, n in sorted(most.items())]
    assert _most_sent(rows, sent=sent).tolist() == [list(row) for row in expected]


def test_held_at_peak_is_the_greatest_of_the_held_states():
    """held_at_peak reads the walk's rows without the frontier; it is the greatest state of held_states."""
    for schedule in V_SCHEDULES:
        for pp, m in [(2, 4), (3, 7), (4, 8), (4, 13), (6, 24), (8, 16)]:
            for rank in range(pp):
                expected = max(held_states(schedule=schedule, pp=pp, m=m, rank=rank))[:2]
                assert held_at_peak(schedule=schedule, pp=pp, m=m, rank=rank) == expected


def test_a_boundary_whose_every_tensor_has_a_gradient_weighs_its_two_counts_as_one():
    """Where D_g = D the price weighs the merged states (sent + grads in one count, as before the gradients were
    counted apart): they are the frontier of the two counts' states once merged, and the state the price picks
    from them holds as many bytes as the one it picks from the two counts."""
    grid = _grid()
    for case in random.Random(1).sample(grid, 300) + [c for c in grid if c["pp"] == 16 and c["m"] == 64]:
        states, merged = rank_states(**case), rank_states(**case, merged=True)
        assert merged == frontier([(*s[:-3], s[-3] + s[-2], s[-1]) for s in states]), case
        g = (len(states[0]) - 3) // 2
        for boundary in (0.0, 1.0, 3.0):
            saved, kept = [2.0, 1.0, 1.5][:g], [1.0] * g
            prices = dict(saved_bytes=saved, kept_bytes=kept, boundary_bytes=boundary, loss_bytes=0.5)
            picked = peak_state(merged, **prices, grad_bytes=boundary)
            apart = peak_state(states, **prices, grad_bytes=boundary)
            weights = [*prices["saved_bytes"], *prices["kept_bytes"], boundary, boundary, prices["loss_bytes"]]
            del weights[2 * g + 1]
            expanded = (*apart[: 2 * g], apart[2 * g] + apart[2 * g + 1], apart[-1])
            assert sum(w * n for w, n in zip(weights, picked)) == sum(w * n for w, n in zip(weights, expanded)), case
