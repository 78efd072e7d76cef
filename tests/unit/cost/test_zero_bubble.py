"""Zero-bubble schedules priced as torch runs them (docs/cost-model.md, "Zero-bubble schedules"): the split
backward (B, W) of a traced graph, and the bubble, activations in flight and output gradients kept from B to W
of ``interleaved_zb`` against a timed replay of the action list torch's ScheduleInterleavedZeroBubble builds."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from synthetic import a100_profile, gpt_graph, synthetic_gpt
from torch_zb_orders import DONE, replay_span, torch_order

from autoplan.cost import CostModel
from autoplan.cost.pp.schedule import in_flight_chunks, pipeline_bubble_s
from autoplan.cost.pp.zero_bubble import pending_weight_grads
from autoplan.errors import PlanError
from autoplan.solve.pins import parse_fixes
from autoplan.solve.space import schedule_options
from autoplan.types import Plan


def _plan(**kw) -> Plan:
    fields = dict(dp=1, tp=1, pp=4, micro_batch_size=1, num_microbatches=8, precision="bf16")
    fields.update(kw)
    return Plan(devices=fields["pp"], **fields)


def _held(actions: list) -> tuple[int, int]:
    """(chunks whose F ran and W did not, of them those whose B ran) at the rank's activation peak."""
    held = pending = 0
    peak = (0, 0)
    for a in actions:
        kind = DONE[a.computation_type]
        held += {"F": 1, "W": -1}.get(kind, 0)
        pending += {"B": 1, "W": -1}.get(kind, 0)
        peak = max(peak, (held, pending))
    return peak


@pytest.mark.parametrize("pp,v,m", [(2, 1, 4), (4, 1, 8), (4, 1, 6), (4, 2, 8), (4, 2, 6), (2, 3, 3), (8, 2, 12)])
@pytest.mark.parametrize(
    "f,b,w", [(1.0, 1.0, 1.0), (1.0, 1.2, 0.8), (1.0, 2.0, 0.5), (0.5, 1.0, 1.5), (1.0, 0.4, 0.9), (0.3, 0.2, 2.0)]
)
def test_the_bubble_is_torchs_schedule_replayed(pp, v, m, f, b, w):
    """(p - 1) max(F, B, F + B - W) / v: the idle time of torch's own action list, timed with a stage's F, B, W;
    (p - 1)(F + B - W) / v, the form priced until 2026-12, only where W <= min(F, B) (the last three cases not)."""
    order = torch_order(pp=pp, v=v, m=m)
    span = replay_span(order, chunks=pp * v, f=f / v, b=b / v, w=w / v)
    plan = _plan(pp=pp, num_microbatches=m, schedule="interleaved_zb", virtual_stages=v)
    priced = pipeline_bubble_s(plan, micro_batch_s=f + b + w, wgrad_s=w, forward_s=f)
    assert priced == pytest.approx(span - m * (f + b + w))


@pytest.mark.parametrize("pp,v,m", [(2, 1, 4), (4, 1, 8), (4, 1, 6), (4, 2, 8), (4, 2, 6), (2, 3, 3), (8, 2, 12)])
def test_activations_and_kept_gradients_are_torchs_at_the_peak(pp, v, m):
    plan = _plan(pp=pp, num_microbatches=m, schedule="interleaved_zb", virtual_stages=v)
    for rank, actions in torch_order(pp=pp, v=v, m=m).items():
        held, pending = _held(actions)
        assert in_flight_chunks(plan, rank) * v == pytest.approx(held)
        assert pending_weight_grads(plan, rank) * v == pytest.approx(pending)


def test_the_backward_splits_into_input_and_weight_gradients():
    """W is the weight GEMMs' share of the backward (a linear's W FLOPs are its forward's); a frozen graph has none."""
    graph = synthetic_gpt(layers=4, hidden=256, heads=8, vocab=8000, seq=128, batch=16)
    plan = _plan(pp=2, num_microbatches=4)
    stages, _, _ = CostModel(graph, a100_profile()).priced_stages(plan)
    for stage in stages:
        assert 0.2 * stage.bwd_s < stage.wgrad_s < 0.5 * stage.bwd_s
        assert stage.wgrad_held_bytes > 0
    params = {name: replace(info, trainable=False) for name, info in graph.parameters.items()}
    frozen, _, _ = CostModel(replace(graph, parameters=params), a100_profile()).priced_stages(plan)
    assert [s.wgrad_s for s in frozen] == [0.0, 0.0] and [s.wgrad_held_bytes for s in frozen] == [0.0, 0.0]


def test_zero_bubble_prices_a_smaller_bubble_and_more_memory_than_1f1b():
    graph = gpt_graph(layers=8, hidden=512, heads=8, seq_len=256, vocab=2048, batch_size=16, dtype_bytes=2)
    model = CostModel(graph, a100_profile())
    base, zb = (model.estimate(_plan(schedule=s)) for s in ("1f1b", "interleaved_zb"))
    assert zb.bubble_s < base.bubble_s and zb.step_time_s < base.step_time_s
    assert zb.peak_memory_bytes > base.peak_memory_bytes  # every stage holds p micro-batches until their W


def test_the_search_offers_zero_bubble_where_torch_runs_it_and_a_pin_keeps_it():
    """Unpinned (solve/schedules.py): v = 1 and each looped v, where there are at least pp micro-batches in
    rounds torch can run; a pin keeps only those."""
    options = schedule_options(pp=2, layers=4, num_microbatches=4, fixes={})
    assert ("interleaved_zb", 1) in options and ("interleaved_zb", 2) in options
    assert not [o for o in schedule_options(pp=4, layers=8, num_microbatches=2, fixes={}) if o[0] == "interleaved_zb"]
    assert not [o for o in schedule_options(pp=4, layers=8, num_microbatches=9, fixes={}) if o[0] == "interleaved_zb"]
    pinned = schedule_options(pp=2, layers=4, num_microbatches=4, fixes=parse_fixes("schedule=zb"))
    assert pinned == [("interleaved_zb", 1), ("interleaved_zb", 2)]


@pytest.mark.parametrize(
    "kw,words",
    [
        (dict(num_microbatches=2), "at least pp micro-batches"),
        (dict(num_microbatches=9), "2 rounds of equal size"),
        (dict(schedule="1f1b", virtual_stages=2), "needs schedule 'interleaved_1f1b' or 'interleaved_zb'"),
    ],
)
def test_plans_zero_bubble_cannot_run_are_one_sentence(kw, words):
    with pytest.raises(PlanError, match=words):
        _plan(**{"schedule": "interleaved_zb", **kw})


class _NormMLP(torch.nn.Module):
    """A pre-norm residual MLP, a stage whose input carries a gradient: a LayerNorm (W is no matmul) and two
    linears."""

    def __init__(self, hidden: int = 32):
        super().__init__()
        self.norm = torch.nn.LayerNorm(hidden)
        self.up, self.down = torch.nn.Linear(hidden, 4 * hidden), torch.nn.Linear(4 * hidden, hidden)

    def forward(self, x):
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))


def test_the_gradients_kept_from_b_to_w_are_what_torchs_split_backward_keeps():
    """torch's stage_backward_input keeps dL/dY of every node where a parameter's path meets the input's, the
    LayerNorm's included (cost/pp/split_backward.py): the price is the bytes of the distinct tensors it keeps."""
    from torch.distributed.pipelining._backward import stage_backward_input

    from autoplan.cost.pp.split_backward import weight_grad_held_bytes
    from autoplan.trace import trace

    module, x = _NormMLP(), torch.randn(2, 8, 32)
    graph = trace(module, (x,))
    priced = sum(weight_grad_held_bytes(graph, node, precision="fp32") for node in graph.nodes)
    inputs = x.clone().requires_grad_()
    out = module(inputs)
    _, groups = stage_backward_input([out], [torch.ones_like(out)], [inputs], module.parameters())
    grads = [t for group in groups for kept in group["grads"] for t in kept if t is not None]  # a tuple per node
    kept = {t.untyped_storage()._cdata: t.untyped_storage().nbytes() for t in grads}
    assert priced == sum(kept.values())  # the norm's output gradient (2 x 8 x 32 x 4 bytes) with the linears'
