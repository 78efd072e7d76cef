"""cost/pp/rank_memory.py ``rank_floors`` (the memory floors read from a rank's rows, without the frontier)
against the same floors taken over the frontier (``rank_states``), as the search took them before: equal, ties
included, on a sample of every (schedule, pp, v, m, rank) torch runs and on every rank of the largest pipelines."""

from __future__ import annotations

import random

import numpy as np
import pytest
from test_rank_states_fast import _grid

from autoplan.cost.pp.rank_memory import _schedule_rows, group_sizes, rank_floors, rank_rows, rank_states


def _on_the_frontier(case: dict) -> tuple:
    """(held_floor, most_sent, held_at_peak) over the frontier's states (the search's floors before rank_floors)."""
    sizes = group_sizes(**{k: v for k, v in case.items() if k != "m"})
    states, g = rank_states(**case), len(sizes)
    most = max(states, key=lambda state: (sum(state[:g]), sum(state[g : 2 * g])))
    floor = min(n / s for n, s in zip(most[:g], sizes)), min(n / s for n, s in zip(most[g : 2 * g], sizes))
    sent = max(state[2 * g] + state[2 * g + 1] for state in states), max(state[2 * g] for state in states)
    peak = max(states, key=lambda state: (sum(state[:g]), sum(state[g : 2 * g]), state[2 * g] + state[2 * g + 1]))
    return floor, sent, (sum(peak[:g]), sum(peak[g : 2 * g]))


def test_rank_floors_are_the_frontiers_on_every_schedule_torch_runs():
    grid = _grid()
    cases = random.Random(1).sample(grid, 500) + [c for c in grid if c["pp"] == 16 and c["m"] in (16, 33, 64)]
    for case in cases:
        floors = rank_floors(**case)
        assert (floors.held_floor, floors.most_sent, floors.held_at_peak) == _on_the_frontier(case), case


def test_a_ranks_rows_are_built_once_read_only_and_as_built_afresh():
    """The floors and a price's rank_states read one (held) copy of a rank's rows, which nobody can edit."""
    case = dict(schedule="interleaved_zb", pp=4, virtual_stages=2, m=8, rank=1)
    first = rank_rows(**case)
    assert rank_rows(**dict(reversed(list(case.items())))) is first  # whatever the keywords' order
    with pytest.raises(ValueError):
        first[0, 0] = 99
    _schedule_rows.cache_clear()
    assert np.array_equal(rank_rows(**case), first)
