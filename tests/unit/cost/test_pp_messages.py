"""The pipeline's sends (autoplan/cost/pp/messages.py) as the audit counts them and the step time
charges them."""

from __future__ import annotations

from dataclasses import replace

import pytest
from synthetic import a100_profile, gpt_graph

from autoplan.cost.model import CostModel
from autoplan.cost.pp.messages import slot_bytes
from autoplan.cost.volumes import predict
from autoplan.types.plan import Plan


@pytest.mark.parametrize("virtual_stages", [1, 2])
def test_every_send_has_its_receive_and_the_slot_is_the_largest_boundary(virtual_stages):
    """Summed over the stages, the audit's sends equal its receives, call for call and byte for
    byte; per micro-batch each chunk boundary crosses once forward and once back, so the sends are
    m times the boundaries; the step time's slot is the largest of them, forward and back."""
    model = CostModel(gpt_graph(layers=4), a100_profile())
    schedule = "interleaved_1f1b" if virtual_stages > 1 else "1f1b"
    plan = Plan(devices=2, dp=1, tp=1, pp=2, micro_batch_size=1, num_microbatches=4, virtual_stages=virtual_stages,
                schedule=schedule)  # fmt: skip
    totals = {"send": [0, 0.0], "recv": [0, 0.0]}
    for stage in predict(model, plan):
        for kind in totals:
            count, size = stage.comm[("pp", kind)]
            totals[kind] = [totals[kind][0] + count, totals[kind][1] + size]
    chunks = model.chunk_inputs(plan)
    boundaries = sum(sum(b.sent) + sum(b.returned) for b in chunks[1:])
    assert totals["send"] == totals["recv"] and totals["send"][1] == pytest.approx(4 * boundaries, rel=1e-12)
    forward, backward = slot_bytes(chunks)
    assert forward == max(sum(b.sent) for b in chunks[1:]) > 0 and backward > 0


def _tp_plan(**kw):
    return Plan(devices=4, dp=1, tp=2, pp=2, micro_batch_size=1, num_microbatches=4, schedule="1f1b", **kw)


@pytest.mark.parametrize("sp", [False, True])
def test_under_tp_each_rank_sends_its_share_and_the_boundary_is_gathered_where_the_executor_gathers_it(sp):
    """autoplan's executor sends 1/tp of each boundary per tp rank (execute/pipeline_scatter.py):
    half the bytes of a runtime that sends it whole (deepspeed). Without SP the receiver all-gathers
    it, and the sender the gradient coming back; under SP the sequence shard stays so and nothing is
    gathered, where the whole-tensor runtime gathers before sending, forward and back."""
    model = CostModel(gpt_graph(layers=4), a100_profile())
    split, whole = _tp_plan(sequence_parallel=sp), _tp_plan(sequence_parallel=sp, runtime="deepspeed")
    (_, cut), (_, full) = model.chunk_inputs(split), model.chunk_inputs(whole)
    assert sum(cut.sent) == pytest.approx(sum(full.sent) / 2)
    assert sum(cut.returned) == pytest.approx(sum(full.returned) / 2)
    gathered = {plan.runtime: [predict(model, plan)[s].comm.get(("tp", "all_gather")) for s in (0, 1)]
                for plan in (split, whole)}  # fmt: skip
    cut_sizes, full_sizes = sorted(size for size, _ in cut.gathers), sorted(size for size, _ in full.gathers)
    if sp:
        assert cut_sizes == [] and full_sizes == [max(full.sent)] * 2
    else:
        assert cut_sizes == [max(full.sent)] * 2 and full_sizes == []
    assert model.estimate(split).pp_comm_s != model.estimate(whole).pp_comm_s
    assert gathered["autoplan"] != gathered["deepspeed"]


@pytest.mark.parametrize("change", [{"micro_batch_size": 2}, {"sequence_parallel": True}, {"runtime": "deepspeed"}])
def test_the_boundary_memo_keys_on_every_plan_field_block_inputs_reads(change):
    """CostModel memoises each chunk's boundary (pp/messages.py BoundaryMemo): after pricing a plan, one that differs
    only in a field block_inputs reads gets a fresh model's boundaries, not the first plan's, and its pipeline
    sends are priced from them (the dtype policy: test_run_dtypes.py prices fp32, bf16 and bf16 under FSDP2 in one
    model)."""
    plan = Plan(devices=8, dp=2, tp=2, pp=2, micro_batch_size=1, num_microbatches=4, schedule="1f1b")
    other = replace(plan, **change)
    model = CostModel(gpt_graph(layers=4), a100_profile())
    before = model.chunk_inputs(plan)
    fresh = CostModel(gpt_graph(layers=4), a100_profile())
    assert model.chunk_inputs(other) == fresh.chunk_inputs(other) != before
    assert model.estimate(other).pp_comm_s == fresh.estimate(other).pp_comm_s
