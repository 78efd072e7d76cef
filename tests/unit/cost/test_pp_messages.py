"""The pipeline's sends (autoplan/cost/pp/messages.py) as the audit counts them and the step time
charges them."""

from __future__ import annotations

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
    boundaries = sum(sum(forward) + sum(backward) for forward, backward in chunks[1:])
    assert totals["send"] == totals["recv"] and totals["send"][1] == pytest.approx(4 * boundaries, rel=1e-12)
    forward, backward = slot_bytes(chunks)
    assert forward == max(sum(f) for f, _ in chunks[1:]) > 0 and backward > 0
