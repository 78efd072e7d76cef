"""``Plan.overlap_param_gather`` (Megatron-LM's --overlap-param-gather, read from its config): ZeRO-1/2's
all-gather of the updated weights priced per block, prefetched under the first forward, instead of
after the optimizer step."""

from __future__ import annotations

import copy

import pytest
from synthetic import a100_profile, gpt_graph

from autoplan.cost import CostModel
from autoplan.errors import PlanError
from autoplan.types.plan import Plan


def _costs(efficiency: float, **fields):
    profile = copy.deepcopy(a100_profile(intra_busbw=2e9))  # a slow link: the gather is comparable to compute
    profile.comm_overlap.efficiency, profile.backend = efficiency, "nccl"
    model = CostModel(gpt_graph(), profile)
    plan = dict(devices=4, dp=4, tp=1, pp=1, micro_batch_size=2, num_microbatches=2, precision="bf16", **fields)
    return model.estimate(Plan(**plan)), model.estimate(Plan(**plan, overlap_param_gather=True))


@pytest.mark.parametrize("zero_stage", [1, 2])
def test_the_gather_hides_under_the_next_forward(zero_stage):
    after, overlapped = _costs(1.0, zero_stage=zero_stage)
    assert 0 < overlapped.dp_comm_exposed_s < after.dp_comm_exposed_s
    saved_s = after.dp_comm_exposed_s - overlapped.dp_comm_exposed_s
    assert overlapped.step_time_s == pytest.approx(after.step_time_s - saved_s)


def test_without_overlap_efficiency_nothing_is_hidden():
    after, overlapped = _costs(0.0, zero_stage=1)
    assert overlapped.dp_comm_exposed_s >= after.dp_comm_exposed_s  # per-block messages, none hidden
    assert overlapped.dp_comm_exposed_s == pytest.approx(after.dp_comm_exposed_s, rel=0.05)


@pytest.mark.parametrize(("zero_stage", "overlap_grad_reduce"), [(0, True), (3, True), (1, False)])
def test_it_needs_zero_1_or_2_with_overlapped_reduction(zero_stage, overlap_grad_reduce):
    with pytest.raises(PlanError, match="overlap_param_gather=true needs zero_stage 1 or 2"):
        Plan(devices=2, dp=2, tp=1, pp=1, micro_batch_size=1, num_microbatches=1, zero_stage=zero_stage,
             overlap_grad_reduce=overlap_grad_reduce, overlap_param_gather=True)  # fmt: skip
