"""Partial overlap of communication with compute (profile comm_overlap.efficiency) in the cost model."""

from __future__ import annotations

import copy

import pytest
from synthetic import a100_profile, gpt_graph

from autoplan.cost import CostModel
from autoplan.cost.pp.schedule import overlapped_sync_exposed_s, partially_hidden_s, prefetched_exposed_s
from autoplan.types.plan import Plan


def _profile(efficiency, backend="nccl"):
    profile = copy.deepcopy(a100_profile(intra_busbw=2e9))  # a slow link: communication is comparable to compute
    profile.comm_overlap.efficiency = efficiency
    profile.backend = backend
    return profile


def _plan(**kw):
    fields = dict(devices=2, dp=2, tp=1, pp=1, micro_batch_size=4, num_microbatches=1, precision="fp32")
    fields.update(kw)
    return Plan(**fields)


def test_prefetch_interpolates_between_hidden_and_serial():
    compute, comm = [1.0, 1.0, 1.0], [0.5, 0.5, 2.0]
    assert prefetched_exposed_s(compute_s=compute, comm_s=comm, efficiency=1.0) == pytest.approx(0.5 + 0.0 + 1.0)
    assert prefetched_exposed_s(compute_s=compute, comm_s=comm, efficiency=0.0) == pytest.approx(sum(comm))
    assert prefetched_exposed_s(compute_s=compute, comm_s=comm, efficiency=0.5) == pytest.approx(0.5 + 0.25 + 1.5)


def test_partial_sync_exposure():
    perfect = overlapped_sync_exposed_s(backward_s=[1.0, 1.0], sync_s=[0.5, 0.5])
    assert perfect == pytest.approx(0.5)
    assert partially_hidden_s(exposed_s=perfect, total_s=1.0, efficiency=1.0) == pytest.approx(0.5)
    assert partially_hidden_s(exposed_s=perfect, total_s=1.0, efficiency=0.0) == pytest.approx(1.0)
    assert partially_hidden_s(exposed_s=perfect, total_s=1.0, efficiency=0.4) == pytest.approx(0.8)


def test_ddp_sync_exposure_grows_as_overlap_falls():
    graph = gpt_graph(layers=4, hidden=256, heads=8, seq_len=128, vocab=1024, batch_size=8)
    costs = [CostModel(graph, _profile(e)).estimate(_plan()) for e in (1.0, 0.5, 0.0)]
    assert costs[0].dp_comm_exposed_s < costs[1].dp_comm_exposed_s < costs[2].dp_comm_exposed_s
    assert costs[2].dp_comm_exposed_s == pytest.approx(costs[2].dp_comm_s)  # nothing hides: all of it shows
    assert costs[0].compute_s == costs[2].compute_s


def test_zero3_exposure_follows_efficiency_under_nccl():
    graph = gpt_graph(layers=4, hidden=256, heads=8, seq_len=128, vocab=1024, batch_size=8)
    full, none = (CostModel(graph, _profile(e)).estimate(_plan(zero_stage=3)) for e in (1.0, 0.0))
    assert full.zero_comm_s < none.zero_comm_s


def test_fsdp_on_gloo_never_overlaps():
    """FSDP2 issues its collectives synchronously without CUDA streams: the profile's eta does not apply."""
    graph = gpt_graph(layers=4, hidden=256, heads=8, seq_len=128, vocab=1024, batch_size=8)
    for zero in (2, 3):
        high, low = (CostModel(graph, _profile(e, backend="gloo")).estimate(_plan(zero_stage=zero)) for e in (1.0, 0.0))
        assert high.step_time_s == pytest.approx(low.step_time_s)
    ddp_high, ddp_low = (CostModel(graph, _profile(e, backend="gloo")).estimate(_plan()) for e in (1.0, 0.0))
    assert ddp_high.step_time_s < ddp_low.step_time_s  # DDP's async all-reduce keeps the measured eta


def test_zero3_pipeline_reduce_scatters_once_per_step_and_plain_zero3_every_micro_batch():
    """Without a pipeline ZeRO-3 reduce-scatters every micro-batch (gradients stay partitioned);
    torch's pipeline stages accumulate unsharded and reduce-scatter once (execute/trainer.py)."""
    graph = gpt_graph(layers=4, hidden=256, heads=8, seq_len=128, vocab=1024, batch_size=8)
    model = CostModel(graph, _profile(0.0))
    one = model.estimate(_plan(zero_stage=3, micro_batch_size=4, num_microbatches=1)).zero_comm_s
    two = model.estimate(_plan(zero_stage=3, micro_batch_size=2, num_microbatches=2)).zero_comm_s
    assert two == pytest.approx(
        2 * one, rel=0.05
    )  # half-size messages, twice as many: latency aside, the same bytes twice
    piped = [
        model.estimate(_plan(zero_stage=3, pp=2, devices=4, micro_batch_size=mb, num_microbatches=n)).zero_comm_s
        for mb, n in ((4, 1), (2, 2))
    ]
    assert piped[0] < piped[1] < 2 * piped[0]  # the extra micro-batch adds its all-gathers, not another reduce-scatter
