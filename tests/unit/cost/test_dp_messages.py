"""The one statement of what data parallelism sends (autoplan/cost/dp/messages.py), the dp term
priced alone from it (cost/dp/sync.py), and the audit's volumes reading the same messages."""

from __future__ import annotations

import dataclasses
import math

import pytest
from synthetic import a100_profile, gpt_graph

from autoplan.cost.blocks import LayerSummary, per_distinct
from autoplan.cost.dp import sync
from autoplan.cost.dp.messages import GRADS, WEIGHTS, dp_messages, expert_messages, find, per_step
from autoplan.cost.dp.sync import DataParallelTerms
from autoplan.cost.memory.per_device import DDP_BUCKET_BYTES
from autoplan.cost.model import CostModel
from autoplan.cost.network.comm import bucketed_time_s, collective_time_s
from autoplan.cost.network.mesh import AxisGroup
from autoplan.cost.stages import StageTotals, add_block
from autoplan.cost.volumes import predict
from autoplan.types.cost import Cost
from autoplan.types.plan import Plan

GROUP = AxisGroup(size=8, ranks_per_node=8)
PARAMS = (1.0e6, 3.0e6)  # two hand-made blocks' parameters


def _plan(**changes) -> Plan:
    fields = dict(devices=8, dp=8, tp=1, pp=1, micro_batch_size=1, num_microbatches=3, precision="bf16")
    fields.update(changes)
    fields["devices"] = fields["dp"] * fields["tp"] * fields["pp"]
    return Plan(**fields)


def _stage(*, compute_s: float = 0.0) -> StageTotals:
    """One stage of the hand-made blocks, each ``compute_s`` forward and backward."""
    stage = StageTotals()
    for index, params in enumerate(PARAMS):
        block = LayerSummary(
            fwd_s=compute_s, bwd_s=compute_s, selective_recompute_s=0.0, tp_fwd_s=0.0, tp_bwd_s=0.0,
            saved_bytes=0.0, selective_dropped_bytes=0.0, input_bytes=0.0, param_count=params,
            param_names=(f"b{index}.w",), param_numels=(params,), flops=0.0,
        )  # fmt: skip
        add_block(stage, block, recompute="none")
    return stage


def _counts(plan: Plan) -> dict[str, tuple[int | None, float]]:
    """Calls and bytes per step of one unit of 1000 parameters, by kind."""
    found = per_step(dp_messages(plan), params=1000, units=1, group_size=plan.dp, num_microbatches=3)
    return {m.kind: (m.count, m.message_bytes) for m in found}


def test_the_zero_repetitions_per_step():
    """ZeRO-3: 2m gathers and m scatters without a pipeline, m + 1 and 1 in one; ZeRO-2: one gather,
    m or 1 scatters; ZeRO-1: a padded reduce-scatter and an fp32 all-gather; DDP: buckets."""
    assert _counts(_plan(zero_stage=3)) == {"all_gather": (6, 6 * 2000), "reduce_scatter": (3, 3 * 4000)}
    assert _counts(_plan(zero_stage=3, pp=2)) == {"all_gather": (4, 4 * 2000), "reduce_scatter": (1, 4000)}
    assert _counts(_plan(zero_stage=2)) == {"all_gather": (1, 2000), "reduce_scatter": (3, 3 * 4000)}
    assert _counts(_plan(zero_stage=2, pp=2, grad_reduce_dtype="bf16")) == {
        "all_gather": (1, 2000),
        "reduce_scatter": (1, 2000),
    }
    padded = 8 * 125  # 1000 parameters over 8 ranks: no padding; 1001 pads to 1008
    assert find(dp_messages(_plan(zero_stage=1)), GRADS).params_sent(1001, 8) == 1008
    assert _counts(_plan(zero_stage=1)) == {"reduce_scatter": (1, padded * 4), "all_gather": (1, padded * 4)}
    assert _counts(_plan()) == {"all_reduce": (None, 4000)}
    assert _counts(_plan(tp=2)) == {"all_reduce": (1, 4000)}  # the explicit all-reduce: one flat call
    assert dp_messages(_plan(dp=1)) == ()


def test_the_experts_sync_apart_only_with_an_all_reduce():
    """Under ep the routed experts' messages are the dense ones over edp, except zero 0's one flat
    all-reduce after the backward; none on a one-rank edp group but ZeRO-1's sharded copies."""
    (apart,) = expert_messages(_plan(ep=4))
    assert apart.apart and apart.kind == "all_reduce" and not apart.bucketed
    assert expert_messages(_plan(ep=4, zero_stage=3)) == dp_messages(_plan(ep=4, zero_stage=3))
    assert expert_messages(_plan(ep=8, zero_stage=3)) == () and expert_messages(_plan(ep=8)) == ()
    assert expert_messages(_plan(ep=8, zero_stage=1)) == dp_messages(_plan(zero_stage=1))


def test_a_zero3_term_priced_alone_on_hand_made_blocks():
    """With no compute to hide under, every gather and reduce-scatter is exposed, as often as the
    statement says: m forwards and m backwards (2m gathers, m scatters) without a pipeline; the
    first forward, m backwards and one scatter in one."""
    terms, stage = DataParallelTerms(a100_profile(), gpt_graph()), _stage()
    gather = sum(collective_time_s(terms.profile, "all_gather", p * 2, group=GROUP) for p in PARAMS)
    scatter = sum(collective_time_s(terms.profile, "reduce_scatter", p * 4, group=GROUP) for p in PARAMS)
    for pp, expected in ((1, 3 * gather + 3 * (gather + scatter)), (2, gather + 2 * gather + gather + scatter)):
        cost = Cost()
        terms.price(cost, _plan(zero_stage=3, pp=pp), [stage], group=GROUP, edp=GROUP)
        assert cost.zero_comm_s == pytest.approx(expected, rel=1e-12)
        assert cost.dp_comm_s == 0.0


def test_a_ddp_term_priced_alone_hides_under_the_backward():
    """DDP's bucketed all-reduce of each block's gradients: all exposed without compute, hidden
    but for the first block's (the last to finish its backward) under a long backward at eta = 1."""
    profile = a100_profile()
    terms = DataParallelTerms(profile, gpt_graph())
    syncs = [bucketed_time_s(profile, "all_reduce", p * 4, group=GROUP, bucket_bytes=DDP_BUCKET_BYTES) for p in PARAMS]
    bare, hidden = Cost(), Cost()
    terms.price(bare, _plan(), [_stage()], group=GROUP, edp=GROUP)
    assert bare.dp_comm_s == pytest.approx(sum(syncs), rel=1e-12) and bare.dp_comm_exposed_s == bare.dp_comm_s
    terms.price(hidden, _plan(), [_stage(compute_s=1.0)], group=GROUP, edp=GROUP)
    eta = profile.comm_overlap.efficiency
    assert hidden.dp_comm_s == bare.dp_comm_s
    assert hidden.dp_comm_exposed_s == pytest.approx(syncs[0] + (1 - eta) * syncs[1], rel=1e-12)


@pytest.mark.parametrize(
    "changes",
    [
        {},
        {"overlap_grad_reduce": False},
        {"zero_stage": 1, "overlap_param_gather": True},
        {"zero_stage": 2},
        {"zero_stage": 2, "dp_replicate": 2},
        {"zero_stage": 3},
        {"zero_stage": 3, "dp_replicate": 2},
    ],
)
def test_copies_of_one_block_are_priced_as_each_alone(changes):
    """A stage of one block summary repeated (as CostModel shares it among identical blocks) gets the
    same dp terms, to the last bit, as a stage of equal but separate summaries: the terms price a
    shared summary once and count it for every block it stands for, in the blocks' order. 10 µs of
    compute per block hides part of each message, so the overlaps read every block's price too."""
    terms, plan = DataParallelTerms(a100_profile(), gpt_graph()), _plan(**changes)
    first, second = _stage(compute_s=1e-5).blocks
    shared, apart = StageTotals(), StageTotals()
    for block in (first, first, second, first, second, second):
        add_block(shared, block, recompute="none")
        add_block(apart, dataclasses.replace(block), recompute="none")
    alike, alone = Cost(), Cost()
    terms.price(alike, plan, [shared], group=GROUP, edp=GROUP, replicate=GROUP)
    terms.price(alone, plan, [apart], group=GROUP, edp=GROUP, replicate=GROUP)
    assert alike.dp_comm_s + alike.zero_comm_s > 0
    assert (alike.dp_comm_s, alike.dp_comm_exposed_s, alike.zero_comm_s) == (
        alone.dp_comm_s,
        alone.dp_comm_exposed_s,
        alone.zero_comm_s,
    )


@pytest.mark.parametrize("pp", [1, 2])
def test_the_audit_predicts_the_bytes_the_time_terms_priced(pp, monkeypatch):
    """ZeRO-3 on a GPT: the bytes the audit predicts per step (cost/volumes.py) are the bytes of
    the messages the time terms priced for one micro-batch's forward and backward, times the
    statement's repetitions (every micro-batch without a pipeline; in one, the first forward's
    gathers and the last backward's scatters once). The terms price a message once per distinct
    block summary (cost/blocks.py per_distinct) and reuse it for each copy: a priced message counts
    as many times as the blocks it stands for."""
    model, plan = CostModel(gpt_graph(), a100_profile()), _plan(zero_stage=3, pp=pp, num_microbatches=4)
    priced: list[tuple[str, str, float]] = []
    copies: list[int] = []  # how many blocks the price being made stands for, nested
    message_s = model.dp_terms.message_s

    def recording(message, message_bytes, group):
        priced.append((message.phase, message.kind, message_bytes * math.prod(copies)))
        return message_s(message, message_bytes, group)

    def counted(blocks, price):
        def once(block):
            copies.append(sum(b is block for b in blocks))
            try:
                return price(block)
            finally:
                copies.pop()

        return per_distinct(blocks, once)

    monkeypatch.setattr(sync, "per_distinct", counted)
    model.dp_terms.message_s = recording
    model.estimate(plan)
    messages = dp_messages(plan)
    audit = [0.0, 0.0]
    for stage in predict(model, plan):
        audit[0] += stage.comm[("dp", "all_gather")][1]
        audit[1] += stage.comm[("dp", "reduce_scatter")][1]
    times = {(m.phase, m.kind): m.times_per_step(plan.num_microbatches) for m in messages}
    sent = [0.0, 0.0]
    for phase, kind, size in priced:
        sent[kind == "reduce_scatter"] += times[(phase, kind)] * size
    assert find(messages, WEIGHTS) and find(messages, GRADS)
    assert audit == pytest.approx(sent, rel=1e-12) and min(sent) > 0


def test_ddp_broadcasts_its_buffers_in_one_message_per_dtype(tmp_path):
    """A BatchNorm holds fp32 statistics and an int64 num_batches_tracked, which torch's coalesced broadcast sends
    as two messages: the audit counted two where one was priced, on every DDP plan of a CNN."""
    from pathlib import Path

    from autoplan.cost import CostModel
    from autoplan.cost.volumes import predict
    from autoplan.profile import load_profile
    from autoplan.trace import trace_model_file
    from autoplan.types import Plan

    model_file = Path(__file__).resolve().parents[2] / "odd_models" / "batch_norm_cnn.py"
    graph = trace_model_file(model_file, 8)
    assert graph.buffer_dtypes == 2
    plan = Plan(devices=2, dp=2, tp=1, pp=1, micro_batch_size=4, num_microbatches=1)
    (stage,) = predict(CostModel(graph, load_profile("cpu-gloo")), plan)
    assert stage.comm[("dp", "broadcast")] == [2, graph.buffer_bytes]
