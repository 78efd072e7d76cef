"""--verify's buffer comparison (execute/job/verify_buffers.py): what the run's ranks hold after a step against the
reference's copy for their dp index."""

from __future__ import annotations

import math

import torch
import torch.nn as nn

from autoplan.execute.job.reference_buffers import RankBuffers
from autoplan.execute.job.verify import original_name, step_table
from autoplan.execute.job.verify_buffers import SUFFIX, buffer_differences, expected_buffers
from autoplan.types.plan import Plan

PLAN = Plan(devices=1, dp=1, tp=1, pp=1, micro_batch_size=4, num_microbatches=1)


def _normed() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4))


def _by_name(diffs) -> dict:
    return {d.name.removesuffix(SUFFIX): d for d in diffs}


def test_equal_buffers_pass_and_a_statistic_updated_twice_fails_with_its_count():
    run, reference = _normed(), _normed()
    x = torch.randn(8, 4)
    run(x)
    reference(x)
    expected = expected_buffers(reference, None, 0)
    same = _by_name(buffer_differences([run], expected, original_name))
    assert set(same) == {"1.running_mean", "1.running_var", "1.num_batches_tracked"}
    assert all(d.relative == 0.0 for d in same.values())
    run(x)  # a second update of the run's statistics only (a forward run again)
    twice = _by_name(buffer_differences([run], expected, original_name))
    assert twice["1.num_batches_tracked"].relative == math.inf
    assert 0.0 < twice["1.running_mean"].relative < math.inf
    passed, lines = step_table(diffs=list(twice.values()), plan=PLAN)
    assert not passed and any("num_batches_tracked (buffer)" in line for line in lines)


def test_each_dp_index_is_compared_with_its_own_copy_and_unknown_buffers_are_left_out():
    run, reference = _normed(), _normed()
    run.register_buffer("made_by_the_executor", torch.ones(3))
    kept = RankBuffers(reference, dp=2, synced_each_step=False)
    kept.start_step(reference)
    for rank, x in enumerate((torch.randn(8, 4), torch.randn(8, 4) + 3.0)):
        kept.enter(reference, rank)
        reference(x)
        kept.leave(reference, rank)
        if rank == 1:
            run(x)  # the run's rank holds dp index 1's buffers
    ones = _by_name(buffer_differences([run], expected_buffers(reference, kept, 1), original_name))
    zeros = _by_name(buffer_differences([run], expected_buffers(reference, kept, 0), original_name))
    assert "made_by_the_executor" not in ones
    assert ones["1.running_mean"].relative == 0.0
    assert zeros["1.running_mean"].relative > 0.1
