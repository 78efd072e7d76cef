"""The per-stage memory the search prices thousands of times (cost/memory/plan.py): the chunk groups a replayed
stage's held counts read, memoised on positional arguments (replayed.py ``_groups``), against rank_memory.py's own
(the peak moment a tie resolves to: test_cost_primitives.py)."""

from __future__ import annotations

import pytest

from autoplan.cost.memory.replayed import _groups
from autoplan.cost.pp.rank_memory import chunk_groups, group_sizes

CASES = [("interleaved_1f1b", 4, 2), ("interleaved_1f1b", 4, 3), ("interleaved_zb", 2, 4), ("zbv", 4, 2)]


@pytest.mark.parametrize(("schedule", "pp", "v"), CASES)
def test_the_memoised_groups_are_rank_memorys_for_each_rank(schedule, pp, v):
    answers = set()
    for rank in range(pp):
        where = dict(schedule=schedule, pp=pp, virtual_stages=v, rank=rank)
        pairs, sizes = _groups(schedule, pp, v, rank)
        assert pairs == tuple(chunk_groups(**where).items())  # in its order: the sums add as before
        assert sizes == group_sizes(**where)
        answers.add(pairs)
    assert len(answers) == pp  # each rank its own chunks: the memo's key holds the rank
