"""Pricing once per group of identical blocks gives each block its own price: on a model whose blocks
differ in width (tests/odd_models/mixed_blocks.py), CostModel.block_summaries shares one summary (and
one tp_comm_overlap decomposition) between identical blocks only, and every block's summary equals the
one priced for that block alone; the memoised collective times equal comm.bucketed_time_s."""

from __future__ import annotations

from pathlib import Path

import pytest
from synthetic import synthetic_profile

from autoplan.cost.model import CostModel
from autoplan.cost.network.comm import BucketedTimes, bucketed_time_s
from autoplan.cost.network.mesh import mesh_groups
from autoplan.cost.tp.default import default_tp_plan
from autoplan.cost.tp.overlap import overlapped
from autoplan.profile import load_profile
from autoplan.trace import trace_model_file
from autoplan.types.plan import Plan

ODD = Path(__file__).resolve().parents[2] / "odd_models"


@pytest.fixture(scope="module")
def mixed():
    return trace_model_file(ODD / "mixed_blocks.py", 8)


@pytest.mark.parametrize("tp_comm_overlap", [False, True])
def test_identical_blocks_share_a_summary_and_each_block_keeps_its_own_price(mixed, tp_comm_overlap):
    profile = load_profile("cpu-gloo")
    plan = Plan(devices=2, dp=1, tp=2, pp=1, micro_batch_size=4, num_microbatches=2)
    tp_plan = default_tp_plan(mixed, 2, sequence_parallel=False)
    model = CostModel(mixed, profile)
    ctx = model.tp_context(plan)
    grouped = model.block_summaries(tp_plan, ctx, tp_comm_overlap)
    efficiency = profile.comm_overlap.efficiency
    for layer in mixed.layers:  # each block priced alone, by a model that has priced nothing else
        alone = CostModel(mixed, profile).block_summary(layer, tp_plan, ctx)
        alone = overlapped(alone, tp=2, efficiency=efficiency) if tp_comm_overlap else alone
        assert grouped[layer] == alone, layer
    distinct = {id(s) for s in grouped.values()}
    widths = {s.param_count for s in grouped.values()}
    assert len(widths) > 1 and len(distinct) < len(mixed.layers)  # unlike blocks, and some alike
    for a in mixed.layers:
        for b in mixed.layers:
            if grouped[a] is grouped[b]:
                assert grouped[a].param_count == grouped[b].param_count


def test_memoised_collective_times_are_the_formula():
    profile = synthetic_profile()
    times = BucketedTimes(profile)
    groups = mesh_groups(profile, dp=64, tp=2, pp=1)
    for kind in ("all_reduce", "all_gather", "reduce_scatter"):
        for size in (0.0, 1.0, 3e6, 7.5e8):
            for bucket in (None, 25 * 2**20):
                for group in (groups["dp"], groups["tp"]):
                    expected = bucketed_time_s(profile, kind, size, group=group, bucket_bytes=bucket)
                    assert times(kind, size, group, bucket) == expected
                    assert times(kind, size, group, bucket) == expected  # the memo's answer
