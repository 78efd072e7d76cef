"""The per-stage memory the search prices thousands of times (cost/memory/plan.py): the peak moment a tie resolves to
(per_device.py ``stage_memory``, the first of M1, M2, M3 at the largest), and the chunk groups a replayed stage's
held counts read, memoised on positional arguments (replayed.py ``_groups``), against rank_memory.py's own."""

from __future__ import annotations

import pytest

from autoplan.cost.memory.per_device import ModelStates, stage_memory
from autoplan.cost.memory.replayed import _groups
from autoplan.cost.pp.rank_memory import chunk_groups, group_sizes


def _memory(*, transient: float, scatter: float, sync: float, after: float, persist: bool):
    return stage_memory(
        states=ModelStates(weights_bytes=100.0, grads_bytes=50.0, optimizer_bytes=200.0),
        saved_bytes=30.0,
        transient_bytes=transient,
        in_flight=4,
        in_flight_after=after,
        last_block_bytes=10.0,
        buffers_bytes=2.0,
        scatter_bytes=scatter,
        sync_bytes=sync,
        grads_persist=persist,
    )


@pytest.mark.parametrize(
    ("transient", "scatter", "sync", "after", "persist", "at_peak"),
    [
        (0.0, 0.0, 0.0, 4, True, (100, 50, 200, 120, 2)),  # M1 = M2 = 172: M1's parts
        (0.0, 0.0, 122.0, 4, False, (100, 50, 200, 120, 2)),  # M2 = M3 = 172, M1 = 122: M2's parts
        (0.0, 20.0, 132.0, 4, False, (100, 50, 200, 110, 22)),  # M2 freeing its block = M3 = 182: M2's scatter
        (0.0, 0.0, 172.0, 1, False, (100, 50, 200, 0, 172)),  # M3 = 222 alone the largest
    ],
)
def test_a_tie_peaks_at_the_first_moment(transient, scatter, sync, after, persist, at_peak):
    memory = _memory(transient=transient, scatter=scatter, sync=sync, after=after, persist=persist)
    assert memory.at_peak_bytes == at_peak
    assert sum(memory.at_peak_bytes) == memory.peak_bytes


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
