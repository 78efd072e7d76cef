"""rank_memory.py's rows of every rank of a schedule made at once (order_states.py ``ranks_states``, memoised per
(schedule, p, v, m) in ``_schedule_rows``): each rank's rows are its own walk's (``order_states`` of that rank
alone), bit for bit and in order, whichever rank is asked first and however the ranks are split into passes."""

from __future__ import annotations

import numpy as np
import pytest

from autoplan.cost.pp import rank_memory
from autoplan.cost.pp.order_states import ranks_states

CASES = [
    *((schedule, pp, v, m) for schedule in ("interleaved_1f1b", "interleaved_zb")
      for pp in (2, 3, 4) for v in (1, 2, 3) for m in (1, 2, pp + 1, 2 * pp + 1, 8)),
    *((schedule, pp, 2, m) for schedule in ("zbv", "dualpipev") for pp in (2, 3, 4) for m in (1, 3, 2 * pp, 9)),
]  # fmt: skip


def _alone(schedule: str, pp: int, v: int, m: int, rank: int) -> np.ndarray:
    return rank_memory._rows(schedule, pp, v, m, rank)


@pytest.mark.parametrize("cells", [rank_memory.RANKS_CELLS, 40])  # one pass of all ranks, or a few at a time
def test_each_rank_has_its_own_rows(monkeypatch, cells):
    monkeypatch.setattr(rank_memory, "RANKS_CELLS", cells)
    rank_memory._schedule_rows.cache_clear()
    for schedule, pp, v, m in CASES:
        for rank in reversed(range(pp)):  # the last rank asked first makes every rank's
            got = rank_memory.rank_rows(schedule=schedule, pp=pp, virtual_stages=v, m=m, rank=rank)
            want = _alone(schedule, pp, v, m, rank)
            assert got.dtype == want.dtype and got.shape == want.shape and (got == want).all(), (schedule, pp, v, m)
            assert not got.flags.writeable
    rank_memory._schedule_rows.cache_clear()


def test_ranks_states_takes_the_ranks_together():
    """Two ranks of one looped schedule in one pass: each the rows order_states gives it alone."""
    where = dict(schedule="interleaved_zb", pp=3, virtual_stages=2, m=5)
    inputs = [rank_memory._rank_inputs(*where.values(), rank) for rank in (0, 1)]
    kinds, chunks, group_of = (np.stack([x[i] for x in inputs]) for i in range(3))
    rows = ranks_states(kinds, chunks, group_of=group_of, last=5, slots=[x[3] for x in inputs])
    for rank, got in enumerate(rows):
        assert (got == _alone(*where.values(), rank)).all()
