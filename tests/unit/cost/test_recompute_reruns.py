"""A recomputed block re-runs its forward once per backward pass (cost/pp/reruns.py): twice where torch splits a
backward into B and W, once where it runs it whole. The count against torch 2.13's own action lists, and the
price (the stage's recomputation time, its collectives, the audit's FLOPs, the partition's and the bounds' block
times) charging that many re-runs and no other."""

from __future__ import annotations

import types

import pytest
import torch
from synthetic import a100_profile, gpt_graph
from torch.distributed.pipelining import schedules as torch_schedules
from torch.distributed.pipelining.schedules import _ComputationType as Op

from autoplan.cost import CostModel
from autoplan.cost.pp.partition import block_time_s, rerun_s
from autoplan.cost.pp.reruns import forward_reruns
from autoplan.cost.tp.splits import block_messages
from autoplan.cost.volumes import predict
from autoplan.solve.stage_costs import StageCosts
from autoplan.types import Plan
from autoplan.types.layout import chunks_of_stage

CLASSES = {
    "interleaved_zb": torch_schedules.ScheduleInterleavedZeroBubble,
    "zbv": torch_schedules.ScheduleZBVZeroBubble,
    "dualpipev": torch_schedules.ScheduleDualPipeV,
}


def _torch_passes(schedule: str, *, pp: int, m: int) -> dict[int, list[int]]:
    """Per chunk, [backwards run whole, backwards run as B then W] in torch's ``pipeline_order`` (no process group),
    an overlapped F&B pair's backward among the whole ones."""
    v = 2
    passes = {c: [0, 0] for c in range(pp * v)}
    for rank in range(pp):
        chunks = chunks_of_stage(rank, pp=pp, virtual_stages=v, v_shape=schedule != "interleaved_zb")
        stages = [
            types.SimpleNamespace(
                num_stages=pp * v, group_size=pp, group_rank=rank, submod=torch.nn.Linear(1, 1), stage_index=s
            )
            for s in chunks
        ]
        for action in (a for a in CLASSES[schedule](stages, m).pipeline_order[rank] if a):
            for a in action.sub_actions if action.computation_type == Op.OVERLAP_F_B else (action,):
                if a.computation_type in (Op.FULL_BACKWARD, Op.BACKWARD_INPUT):
                    passes[a.stage_index][a.computation_type == Op.BACKWARD_INPUT] += 1
    return passes


@pytest.mark.parametrize("schedule", ["interleaved_zb", "zbv", "dualpipev"])
@pytest.mark.parametrize("pp", [2, 3, 4, 5])
def test_a_chunks_reruns_are_torchs_passes_per_micro_batch_one_for_chunk_0(schedule, pp):
    """Each whole backward one pass, each split one two; chunk 0 one whatever its split (torch's first stage runs
    no B: its W is a full backward, stage.py backward_one_chunk / backward_weight_one_chunk)."""
    for m in (2 * pp, 2 * pp + 1, 3 * pp):
        if schedule == "interleaved_zb" and m % pp:
            continue  # torch's rounds need p | m (types/schedules.py)
        for chunk, (whole, split) in _torch_passes(schedule, pp=pp, m=m).items():
            assert whole + split == m
            want = 1.0 if chunk == 0 else (whole + 2 * split) / m
            got = forward_reruns(schedule=schedule, pp=pp, num_microbatches=m, chunk=chunk)
            assert got == pytest.approx(want, rel=1e-12), (schedule, pp, m, chunk)


def test_dualpipev_splits_only_the_backwards_outside_its_overlapped_middle():
    """pp = 4, m = 8 (the audit's): chunks 1..7 split 3, 3, 2, 2, 2, 3, 3 of their 8 backwards
    (reruns.py's closed form), so 1 + splits / 8 re-runs."""
    got = [forward_reruns(schedule="dualpipev", pp=4, num_microbatches=8, chunk=c) for c in range(8)]
    assert got == [1.0, 1.375, 1.375, 1.25, 1.25, 1.25, 1.375, 1.375]
    assert {forward_reruns(schedule=s, pp=4, num_microbatches=8, chunk=3) for s in ("1f1b", "gpipe")} == {1.0}


@pytest.fixture(scope="module")
def model() -> CostModel:
    return CostModel(gpt_graph(layers=8, hidden=512, heads=8, seq_len=256, vocab=2048, batch_size=16), a100_profile())


def _plan(schedule: str, recompute: str = "full", **kw) -> Plan:
    fields = dict(devices=4, dp=1, tp=1, pp=4, micro_batch_size=1, num_microbatches=8, precision="bf16")
    return Plan(**{**fields, "schedule": schedule, "virtual_stages": 2, "recompute": recompute, **kw})


def _chunk_counts(model: CostModel, plan: Plan, stage: int) -> list[tuple[str, float]]:
    """(block, re-runs) of each block stage ``stage`` runs, from the torch order's count (not from the price)."""
    placed = chunks_of_stage(stage, pp=plan.pp, virtual_stages=2, v_shape=plan.schedule in ("zbv", "dualpipev"))
    chunks = model._chunks(plan)
    out = []
    for c in placed:
        whole, split = _torch_passes(plan.schedule, pp=plan.pp, m=plan.num_microbatches)[c]
        count = 1.0 if c == 0 else (whole + 2 * split) / plan.num_microbatches
        out += [(layer, count) for layer in chunks[c]]
    return out


@pytest.mark.parametrize("schedule", ["interleaved_zb", "zbv", "dualpipev"])
@pytest.mark.parametrize("recompute", ["full", "selective"])
def test_a_split_stages_recompute_time_and_flops_are_its_reruns(model, schedule, recompute):
    """Stage by stage: the priced recomputation time is each block's re-run times its count (two where B and W
    split, one where whole), and the audit's backward matmul FLOPs add the re-runs' forward FLOPs as often (full:
    selective's re-runs keep the matmuls). With one re-run per block (before) the split stages fell short."""
    plan = _plan(schedule, recompute)
    stages, tp_plan, ctx = model.priced_stages(plan)
    summaries = model.block_summaries(tp_plan, ctx, plan.tp_comm_overlap)
    predictions = predict(model, plan)
    for index, stage in enumerate(stages):
        counts = _chunk_counts(model, plan, index)
        again = {"full": "fwd_s", "selective": "selective_recompute_s"}[recompute]
        want_s = sum(r * getattr(summaries[layer], again) for layer, r in counts)
        assert stage.recompute_s == pytest.approx(want_s, rel=1e-12), index
        assert any(r == 2.0 for _, r in counts) or schedule == "dualpipev"
        rerun_flops = sum(r * summaries[layer].matmul_fwd_flops for layer, r in counts) if recompute == "full" else 0
        want_flops = plan.num_microbatches * (sum(b.matmul_bwd_flops for b in stage.blocks) + rerun_flops)
        assert predictions[index].backward_flops == pytest.approx(want_flops, rel=1e-12), index


def test_the_bounds_stage_times_are_the_prices_and_the_partition_charges_the_mean(model):
    """StageCosts.stage_totals (the search's per-stage floor) charges each chunk's own re-runs, as the price does;
    the partition, which places blocks before their chunk is known, charges their mean over the chunks."""
    costs = StageCosts(model.graph, model.profile, model)
    for schedule in ("interleaved_zb", "dualpipev", "interleaved_1f1b"):
        plan = _plan(schedule)
        stages, tp_plan, ctx = model.priced_stages(plan)
        times, _ = costs.stage_totals(plan, model._chunks(plan))
        assert times == pytest.approx([s.micro_batch_s for s in stages], rel=1e-9), schedule
        summaries = list(model.block_summaries(tp_plan, ctx, plan.tp_comm_overlap).values())
        counts = [forward_reruns(schedule=schedule, pp=4, num_microbatches=8, chunk=c) for c in range(8)]
        mean = sum(counts) / len(counts)
        want = [block_time_s(b, "full") + (mean - 1.0) * rerun_s(b, "full") for b in summaries]
        assert costs.problem(plan).layer_time_s == pytest.approx(want, rel=1e-12), schedule


def test_memoised_stage_totals_are_each_schedules_own():
    """CostModel's per-stage totals are memoised per placement, shared by schedules of one placement: the re-runs
    tell apart interleaved_zb from interleaved_1f1b, dualpipev from zbv and DualPipeV at m from m + 1 (its count
    reads m), each priced as a fresh CostModel prices it."""
    graph, profile = gpt_graph(layers=8, hidden=512, heads=8, seq_len=256, vocab=2048, batch_size=16), a100_profile()
    shared = CostModel(graph, profile)
    tp_plan = shared.priced_stages(_plan("zbv"))[1]  # one tp_plan object: the memo keys on it
    plans = [
        _plan(s, rc, num_microbatches=m, tp_plan=tp_plan)
        for rc in ("full", "selective")
        for s, m in (("interleaved_zb", 8), ("interleaved_1f1b", 8), ("zbv", 8), ("dualpipev", 8), ("dualpipev", 9))
    ]
    for plan in plans:
        got = [s.recompute_s for s in shared.priced_stages(plan)[0]]
        assert got == [s.recompute_s for s in CostModel(graph, profile).priced_stages(plan)[0]], plan.describe()


def test_memoised_v_forward_share_is_each_plans_own(model):
    """StageCosts' V bubble floor reads a floor on f / T at the most re-runs any chunk makes (more re-runs, a lower
    share): memoised per context, it tells zbv (2) from dualpipev (1 + splits / m) and m from m + 1, each floor as
    a fresh StageCosts finds it (a zbv floor taken from dualpipev's share would not be a floor)."""
    shared = StageCosts(model.graph, model.profile, model)
    tp_plan = model.priced_stages(_plan("zbv"))[1]
    plans = [_plan(s, "full", num_microbatches=m, tp_plan=tp_plan) for s, m in (("dualpipev", 8), ("zbv", 8))]
    plans.append(_plan("dualpipev", "full", num_microbatches=9, tp_plan=tp_plan))
    for plan in plans:
        fresh = StageCosts(model.graph, model.profile, model)
        got = shared.bubble_floor(plan, may_offload=False)
        assert got == fresh.bubble_floor(plan, may_offload=False), plan.describe()
    assert len({shared.bubble_floor(p, may_offload=False) for p in plans}) == 3


@pytest.mark.parametrize("schedule", ["interleaved_zb", "dualpipev"])
def test_the_audits_tp_collectives_repeat_the_forwards_per_rerun(model, schedule):
    """Each re-run sends the block's forward TP collectives again (cost/volumes.py, as the step time charges
    them): full recomputation adds, per stage and kind, m x the re-runs x the forward's messages."""
    plans = {rc: _plan(schedule, rc, tp=2, devices=8) for rc in ("none", "full")}
    (stages, tp_plan, ctx), m = model.priced_stages(plans["full"]), plans["full"].num_microbatches
    got = {rc: predict(model, plan) for rc, plan in plans.items()}
    for index in range(len(stages)):
        counts = _chunk_counts(model, plans["full"], index)
        added: dict[str, float] = {}
        for layer, r in counts:
            for kind, (count, _) in block_messages(model.graph, layer, tp_plan, ctx=ctx)[0].by_kind.items():
                added[kind] = added.get(kind, 0.0) + m * r * count
        for kind, count in added.items():
            more = got["full"][index].comm[("tp", kind)][0] - got["none"][index].comm[("tp", kind)][0]
            assert more == round(count), (index, kind)
        assert any(r > 1 for _, r in counts)
