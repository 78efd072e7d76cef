"""Budgeted recompute (issue 34 item 3): Plan.recompute_blocks validated, priced per block, and the
fewest recomputed blocks per chunk that fit (cost/memory/recompute_budget.py)."""

from dataclasses import replace

import pytest
from synthetic import gpt_graph, synthetic_profile

from autoplan.cost import CostModel, fit_recompute_blocks, stage_peaks_bytes, usable_bytes
from autoplan.errors import PlanError
from autoplan.types import Plan

GIB = 2**30


def _plan(**kw):
    fields = dict(devices=1, dp=1, tp=1, pp=1, micro_batch_size=1, num_microbatches=4, precision="bf16")
    fields.update(kw)
    fields["devices"] = fields["dp"] * fields["tp"] * fields["pp"]
    return Plan(**fields)


@pytest.fixture(scope="module")
def model():
    graph = gpt_graph(layers=6, hidden=512, heads=8, seq_len=512, vocab=1024, batch_size=4, dtype_bytes=2)
    return CostModel(graph, synthetic_profile())


@pytest.mark.parametrize(
    "fields, message",
    [
        (dict(recompute="none", recompute_blocks=[1]), "with recompute='none'"),
        (dict(recompute="full", recompute_blocks=[1, 1]), "expected one per pipeline chunk, pp\\*virtual_stages = 1"),
        (dict(recompute="full", recompute_blocks=[-1]), "integers >= 0"),
        (dict(recompute="full", recompute_blocks=[True]), "integers >= 0"),
        (dict(recompute="full", recompute_blocks="2"), "expected a list"),
        (
            dict(pp=2, recompute="full", recompute_blocks=[1, 3], stages=[["h.0"], ["h.1", "h.2"]]),
            "recompute_blocks\\[1\\]=3 but pipeline chunk 1 runs 2 blocks",
        ),
    ],
)
def test_a_bad_budget_is_refused_in_one_sentence(fields, message):
    with pytest.raises(PlanError, match=message):
        _plan(**fields)


def test_the_budget_is_saved_only_when_set_and_read_back():
    assert "recompute_blocks" not in _plan(recompute="full").to_dict()  # plan files without it stay as they were
    plan = _plan(pp=2, recompute="selective", recompute_blocks=[2, 0], stages=[["h.0", "h.1"], ["h.2"]])
    assert Plan.from_dict(plan.to_dict()) == plan and "rc=selective:2/0" in plan.describe()


def test_a_budget_larger_than_the_graphs_chunk_is_refused(model):
    with pytest.raises(PlanError, match="chunk 0 runs 3 blocks"):
        model.estimate(_plan(pp=2, recompute="full", recompute_blocks=[4, 0]))


@pytest.mark.parametrize("mode", ["full", "selective"])
@pytest.mark.parametrize("layout", [dict(), dict(dp=2, zero_stage=2)])  # the dp sync's backward slots too
def test_k_zero_prices_as_none_and_k_all_as_every_block(model, mode, layout):
    none, every = model.estimate(_plan(recompute="none", **layout)), model.estimate(_plan(recompute=mode, **layout))
    zero, six = (model.estimate(_plan(recompute=mode, recompute_blocks=[k], **layout)) for k in (0, 6))
    for field in ("step_time_s", "recompute_s", "dp_comm_exposed_s", "peak_memory_bytes", "activations_bytes"):
        assert getattr(zero, field) == pytest.approx(getattr(none, field)), field
        assert getattr(six, field) == pytest.approx(getattr(every, field)), field
    assert zero.extra["hardware_flops"] == pytest.approx(none.extra["hardware_flops"])
    assert six.extra["hardware_flops"] == pytest.approx(every.extra["hardware_flops"])


def test_each_block_recomputed_costs_one_blocks_time_and_flops(model):
    costs = [model.estimate(_plan(recompute="full", recompute_blocks=[k])) for k in range(7)]
    rerun_s = [c.recompute_s for c in costs]
    flops = [c.extra["hardware_flops"] for c in costs]
    steps_s = [b - a for a, b in zip(rerun_s, rerun_s[1:])]
    assert all(step == pytest.approx(steps_s[0]) and step > 0 for step in steps_s)  # identical blocks
    assert all(b - a == pytest.approx(flops[1] - flops[0]) and b > a for a, b in zip(flops, flops[1:]))
    activations = [c.activations_bytes for c in costs]
    assert all(b < a for a, b in zip(activations[1:], activations[2:]))  # beyond the first, memory falls


def test_a_budget_prices_each_stage_apart(model):
    stages = [["h.0", "h.1", "h.2"], ["h.3", "h.4", "h.5"]]
    plan = _plan(pp=2, num_microbatches=4, recompute="full", stages=stages)
    every = stage_peaks_bytes(model, plan, [3, 3])
    first_only = stage_peaks_bytes(model, plan, [3, 0])
    assert first_only[0] == pytest.approx(every[0]) and first_only[1] > every[1]


def test_the_fit_is_the_fewest_blocks_that_fit():
    graph = gpt_graph(layers=8, hidden=1024, heads=16, seq_len=1024, vocab=1024, batch_size=8, dtype_bytes=2)
    probe = CostModel(graph, synthetic_profile())
    plan = _plan(micro_batch_size=8, num_microbatches=1, recompute="full")
    peaks = [stage_peaks_bytes(probe, plan, [k])[0] for k in range(9)]
    # a device whose usable memory lies between the peaks of 4 and 5 blocks recomputed fits k = 5
    target = (peaks[4] + peaks[5]) / 2
    memory = int(target / usable_bytes(GIB) * GIB)
    model = CostModel(graph, synthetic_profile(memory_bytes=memory))
    limit = usable_bytes(memory)
    assert peaks[4] > limit >= peaks[5] and peaks[0] > limit
    assert fit_recompute_blocks(model, plan) == [5]
    assert model.estimate(replace(plan, recompute_blocks=[5])).feasible
    assert not model.estimate(replace(plan, recompute_blocks=[4])).feasible
    assert fit_recompute_blocks(probe, plan) == [0]  # on 80 GB nothing need recompute
    assert fit_recompute_blocks(model, _plan(recompute="none")) is None


def test_an_interleaved_fit_gives_each_chunk_its_stages_count():
    """pp=2 x v=2: chunks 0 and 2 run on stage 0, 1 and 3 on stage 1; a stage's count goes to each of its
    chunks (capped at the chunk's blocks), and the fit is the fewest for each stage."""
    graph = gpt_graph(layers=8, hidden=1024, heads=16, seq_len=1024, vocab=1024, batch_size=8, dtype_bytes=2)
    chunks = [[f"h.{2 * c}", f"h.{2 * c + 1}"] for c in range(4)]
    plan = _plan(pp=2, virtual_stages=2, schedule="interleaved_1f1b", micro_batch_size=2, recompute="full",
                 stages=chunks)  # fmt: skip
    probe = CostModel(graph, synthetic_profile())
    peaks = {k: stage_peaks_bytes(probe, plan, [k] * 4) for k in range(3)}
    usable = (peaks[0][0] + peaks[1][0]) / 2  # stage 0 fits with 1 block per chunk, not 0
    memory = int(usable / usable_bytes(GIB) * GIB)
    counts = fit_recompute_blocks(CostModel(graph, synthetic_profile(memory_bytes=memory)), plan)
    assert counts[0] == counts[2] == 1 and counts[1] == counts[3] and len(counts) == 4
    assert peaks[counts[1]][1] <= usable_bytes(memory) and (
        counts[1] == 0 or peaks[counts[1] - 1][1] > usable_bytes(memory)
    )


def test_the_first_block_recomputed_selectively_prices_its_rerun_as_the_transient(model):
    """torch's checkpoint re-runs a block whole at its backward's first unpack (early stop off,
    execute/recompute.py) and keeps every tensor the re-run saves until it is unpacked, so one block's
    dropped tensors are live again at once: the first block recomputed selectively saves that much less
    than each further one (stage 0, without the loss's transient)."""
    stages = [["h.0", "h.1", "h.2"], ["h.3", "h.4", "h.5"]]
    plan = _plan(pp=2, num_microbatches=4, recompute="selective", stages=stages)
    peaks = [stage_peaks_bytes(model, plan, [k, 0])[0] for k in range(3)]
    first, further = peaks[0] - peaks[1], peaks[1] - peaks[2]
    priced, _tp_plan, _ctx = model.priced_stages(plan)
    dropped = priced[0].blocks[-1].selective_dropped_bytes  # h.2's, as every block's (identical blocks)
    assert dropped > 0 and further > 0
    assert further - first == pytest.approx(dropped)
