"""The V schedules (zbv, dualpipev) as torch 2.13 builds and runs them (docs/cost-model.md, "V schedules"):
their placement, each rank's action order against torch's own ``pipeline_order``, the replay's bubble and
activations against the published tables and the closed forms, and what the cost model, the audit and the
search make of them."""

from __future__ import annotations

import types

import pytest
import torch
from synthetic import a100_profile, gpt_graph
from torch.distributed.pipelining import schedules as torch_schedules
from torch.distributed.pipelining._utils import generate_stage_to_rank_mapping
from torch.distributed.pipelining.schedules import _ComputationType as Op

from autoplan.cost import CostModel
from autoplan.cost.memory.replayed import replayed_held
from autoplan.cost.pp.replay import held_at_peak, held_states, replay_bubble_s, replay_finish_s
from autoplan.cost.pp.schedule import in_flight_chunks, pipeline_bubble_s
from autoplan.cost.pp.v_orders import v_order
from autoplan.cost.volumes import predict
from autoplan.errors import PlanError
from autoplan.solve.pins import parse_fixes
from autoplan.solve.space import schedule_options
from autoplan.types import Plan
from autoplan.types.layout import chunks_of_stage, sent_from_prior, stage_of_chunk

KIND = {Op.FORWARD: "F", Op.BACKWARD_INPUT: "B", Op.BACKWARD_WEIGHT: "W", Op.FULL_BACKWARD: "BW"}
CLASSES = {"zbv": torch_schedules.ScheduleZBVZeroBubble, "dualpipev": torch_schedules.ScheduleDualPipeV}


def _ours(action) -> tuple:
    """torch's action as (kind, chunk, micro-batch), an overlapped pair as ("FB", F's chunk, mb, B's chunk, mb)."""
    if action.computation_type == Op.OVERLAP_F_B:
        f, b = action.sub_actions
        return ("FB", f.stage_index, f.microbatch_index, b.stage_index, b.microbatch_index)
    return (KIND[action.computation_type], action.stage_index, action.microbatch_index)


def _torch_order(cls, *, pp: int, m: int, chunks_of) -> tuple:
    """Each rank's actions as ``cls`` builds them, without a process group."""
    order = []
    for rank in range(pp):
        stages = [
            types.SimpleNamespace(
                num_stages=len(chunks_of(0)) * pp,
                group_size=pp,
                group_rank=rank,
                submod=torch.nn.Linear(1, 1),
                stage_index=s,
            )  # fmt: skip
            for s in chunks_of(rank)
        ]
        order.append(tuple(_ours(a) for a in cls(stages, m).pipeline_order[rank] if a))
    return tuple(order)


def _v_chunks(pp: int):
    return lambda rank: chunks_of_stage(rank, pp=pp, virtual_stages=2, v_shape=True)


@pytest.mark.parametrize("pp", [2, 3, 4, 5, 8])
def test_the_v_placement_is_torchs_and_its_turn_is_not_sent(pp):
    torch_map = generate_stage_to_rank_mapping(pp, 2 * pp, style="v")
    assert {c: stage_of_chunk(c, pp=pp, v_shape=True) for c in range(2 * pp)} == torch_map
    assert all(c in chunks_of_stage(torch_map[c], pp=pp, virtual_stages=2, v_shape=True) for c in range(2 * pp))
    assert [c for c in range(2 * pp) if not sent_from_prior(c, pp=pp, v_shape=True)] == [0, pp]


@pytest.mark.parametrize("schedule", ["zbv", "dualpipev"])
@pytest.mark.parametrize("pp", [2, 3, 4, 5, 6, 7, 8])
def test_each_ranks_order_is_torchs(schedule, pp):
    for m in (2 * pp, 2 * pp + 1, 3 * pp, 4 * pp):
        assert v_order(schedule, pp=pp, m=m) == _torch_order(CLASSES[schedule], pp=pp, m=m, chunks_of=_v_chunks(pp))


@pytest.mark.parametrize("pp,v,m", [(2, 1, 4), (4, 1, 8), (4, 2, 8), (8, 2, 16)])
def test_the_replay_of_torchs_interleaved_zb_order_is_its_closed_form_at_equal_times(pp, v, m):
    """looped_replay.py's (p - 1) max(F, B, F + B - W) / v is what the generic replay finds in torch's ZB1P order."""

    def looping(rank):
        return chunks_of_stage(rank, pp=pp, virtual_stages=v)

    order = _torch_order(torch_schedules.ScheduleInterleavedZeroBubble, pp=pp, m=m, chunks_of=looping)
    place = [stage_of_chunk(c, pp=pp) for c in range(pp * v)]
    t = 1.0 / v  # one chunk's F = B = W
    span = max(replay_finish_s(order, place=place, seconds={"F": t, "B": t, "W": t}))
    plan = Plan(devices=pp, pp=pp, dp=1, tp=1, micro_batch_size=1, num_microbatches=m, schedule="interleaved_zb",
                virtual_stages=v)  # fmt: skip
    assert pipeline_bubble_s(plan, micro_batch_s=3.0, wgrad_s=1.0, forward_s=1.0) == pytest.approx(span - 3.0 * m)


@pytest.mark.parametrize("pp", [2, 4, 8])
def test_dualpipev_replays_to_the_dualpipe_readme_at_equal_times(pp):
    """deepseek-ai/DualPipe: (PP/2 - 1)(F&B + B - 3W) with PP = 2p chunks, a chunk's F = W = 1 and B = 2 (whole
    backward): the replay's pairs taken whole tend to it as F&B -> F + B; run apart, as torch runs them without
    an overlap function, DualPipeV's bubble is ZBV's: the last rank's wait for the V's first leg, (p - 1) chunk
    forwards. Activations: 2p + 1 chunks (the README's PP + 1), ZBV 1F1B's p stages (2p chunks)."""
    m, place = 4 * pp, [stage_of_chunk(c, pp=pp, v_shape=True) for c in range(2 * pp)]
    whole = {"F": 1.0, "B": 1.0, "W": 1.0, "BW": 2.0, "FB": 3.0 - 1e-9}  # an overlap too small to matter
    span = max(replay_finish_s(v_order("dualpipev", pp=pp, m=m), place=place, seconds=whole))
    assert span - m * 6.0 == pytest.approx((pp - 1) * (3.0 + 2.0 - 3.0), abs=1e-6)
    stage = dict(f=2.0, b=2.0, w=2.0)  # two chunks of F = B_input = W = 1
    assert replay_bubble_s(schedule="dualpipev", pp=pp, m=m, **stage) == pytest.approx(pp - 1)
    assert replay_bubble_s(schedule="zbv", pp=pp, m=m, **stage) == pytest.approx(pp - 1)
    for rank in range(pp):
        assert held_at_peak(schedule="dualpipev", pp=pp, m=m, rank=rank)[0] == 2 * pp + 1
        assert held_at_peak(schedule="zbv", pp=pp, m=m, rank=rank) == (2 * pp, 1)


def _v_plan(schedule: str, **kw) -> Plan:
    fields = dict(devices=4, dp=1, tp=1, pp=4, micro_batch_size=1, num_microbatches=8, precision="bf16")
    return Plan(**{**fields, "schedule": schedule, "virtual_stages": 2, **kw})


@pytest.fixture(scope="module")
def model() -> CostModel:
    return CostModel(gpt_graph(layers=8, hidden=512, heads=8, seq_len=256, vocab=2048, batch_size=16), a100_profile())


@pytest.mark.parametrize("schedule", ["zbv", "dualpipev"])
def test_a_v_plan_runs_its_loss_on_stage_0_and_sends_nothing_at_the_turn(model, schedule):
    plan = _v_plan(schedule)
    stages, _, _ = model.priced_stages(plan)
    assert stages[0].loss_grad_bytes > 0 and all(s.loss_grad_bytes == 0 for s in stages[1:])
    assert model.stage_layers(plan, 3) == ["h.3", "h.4"] and model.stage_layers(plan, 0) == ["h.0", "h.7"]
    sends = [dict(stage.comm) for stage in predict(model, plan)]
    chunks = model.chunk_inputs(plan)
    one = sum(chunks[1].sent)  # every boundary of this GPT carries the same hidden states
    # a middle stage sends its two chunks' outputs; the last sends only the first leg's gradient back
    assert sends[1][("pp", "send")] == [4 * 8, pytest.approx(4 * 8 * one)]
    assert sends[3][("pp", "send")] == [2 * 8, pytest.approx(2 * 8 * one)]
    assert sum(s[("pp", "send")][1] for s in sends) == pytest.approx(2 * 8 * one * (2 * 4 - 2))


def test_v_schedules_price_their_replay_and_hold_its_peak(model):
    base, zbv, dual = (model.estimate(_v_plan(s)) for s in ("interleaved_1f1b", "zbv", "dualpipev"))
    assert zbv.bubble_s < base.bubble_s and dual.bubble_s < base.bubble_s
    assert in_flight_chunks(_v_plan("zbv"), 2) == 4.0 and in_flight_chunks(_v_plan("dualpipev"), 2) == 4.5


def test_the_search_offers_v_schedules_unasked_where_their_runtime_runs_them():
    for runtime in ("autoplan", "torchtitan"):
        offered = schedule_options(pp=2, layers=8, num_microbatches=8, fixes={}, runtime=runtime)
        assert [o for o in offered if o[0] in CLASSES] == [("zbv", 2), ("dualpipev", 2)]
    for runtime in ("megatron", "deepspeed"):  # no V placement (docs/export.md): only under a pin
        assert not [
            o
            for o in schedule_options(pp=2, layers=8, num_microbatches=8, fixes={}, runtime=runtime)
            if o[0] in CLASSES
        ]
    assert not [o for o in schedule_options(pp=4, layers=8, num_microbatches=6, fixes={}) if o[0] in CLASSES]
    for name in CLASSES:
        pin = parse_fixes(f"schedule={name}")
        assert schedule_options(pp=2, layers=8, num_microbatches=8, fixes=pin, runtime="megatron") == [(name, 2)]
        assert not schedule_options(pp=4, layers=8, num_microbatches=6, fixes=pin)  # m < 2p
        assert not schedule_options(pp=1, layers=8, num_microbatches=8, fixes=pin)


@pytest.mark.parametrize("schedule", ["zbv", "dualpipev"])
@pytest.mark.parametrize("pp", [2, 3, 4])
def test_every_tensor_handed_to_a_neighbour_is_held_to_the_steps_end(schedule, pp):
    """torch's runtime waits its sends after the last action, and each chunk keeps m forward and m gradient
    receive slots (cost/pp/receive_slots.py): once every chunk's backward ran, stage 0 holds chunk 0's m
    outputs and gradient slots and the last chunk's m input gradients and forward slots, the turn's stage
    6m (its chunks hand each other their tensors in the slots) and every other stage 8m."""
    m = 2 * pp + 2
    for rank in range(pp):
        end = 4 * m if rank == 0 else 6 * m if rank == pp - 1 else 8 * m
        states = held_states(schedule=schedule, pp=pp, m=m, rank=rank)
        assert max(sent for _, _, sent in states) == end


def test_a_middle_stage_prices_the_tensors_its_sends_hold(model):
    """The middle stage's peak holds the boundary tensors of its finished micro-batches (the audit's +27% on
    examples/gpt.py before they were priced): more than the chunks and kept gradients alone."""
    plan = _v_plan("zbv")
    stages, _, _ = model.priced_stages(plan)
    held, pending, sent, _loss = replayed_held(plan, 2, stages[2])
    assert sent > 0
    peak = model.stage_memory(plan, stages)[2].at_peak_bytes[3]
    assert peak == pytest.approx(held * stages[2].saved_bytes + pending * stages[2].wgrad_held_bytes + sent)


@pytest.mark.parametrize(
    "kw,words",
    [
        (dict(virtual_stages=3), "runs exactly 2 chunks per stage"),
        (dict(num_microbatches=6), "needs at least 2 \\* pp = 8 micro-batches"),
        (dict(pp=1, devices=1, num_microbatches=2), "needs pp >= 2"),
    ],
)
def test_v_plans_that_cannot_run_are_one_sentence(kw, words):
    with pytest.raises(PlanError, match=words):
        _v_plan("zbv", **kw)


@pytest.mark.parametrize("framework,words", [("megatron", "Megatron-Core 0.16 loops"), ("deepspeed", "DeepSpeed runs")])
def test_export_refuses_a_v_schedule_where_the_framework_cannot_place_it_in_one_sentence(
    framework, words, tmp_path, capsys
):
    from autoplan.cli import main

    path = tmp_path / "plan.json"
    _v_plan("dualpipev", devices=2, pp=2, num_microbatches=4).save(path)
    assert main(["export", str(path), "--to", framework, "--out", str(tmp_path / framework)]) == 2
    said = capsys.readouterr().err.strip()
    assert said.startswith("autoplan: error: schedule=dualpipev: " + words) and said.count("\n") == 0
    assert "cannot place two chunks per rank in a V" in said and "Traceback" not in said


def test_a_weight_tied_across_the_vs_first_and_last_chunk_is_held_twice_on_stage_0():
    """The executor runs each chunk as its own stage module: an embedding tied to the head is two Parameters on
    stage 0 in a V (summed locally, no pp all-reduce), one per stage module elsewhere."""
    from autoplan.trace import trace

    class Tied(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.wte = torch.nn.Embedding(64, 16)
            self.h = torch.nn.ModuleList(torch.nn.Linear(16, 16) for _ in range(4))
            self.head = torch.nn.Linear(16, 64, bias=False)
            self.head.weight = self.wte.weight

        def forward(self, idx):
            x = self.wte(idx)
            for block in self.h:
                x = block(x)
            return self.head(x)

    model = CostModel(trace(Tied(), (torch.zeros(4, 8, dtype=torch.long),)), a100_profile())
    for schedule, tied_copies in (("zbv", 2), ("interleaved_1f1b", 1)):
        plan = _v_plan(schedule, devices=2, pp=2, num_microbatches=4)
        stages, _, _ = model.priced_stages(plan)
        assert stages[0].params - 2 * (16 * 16 + 16) == tied_copies * 64 * 16, schedule
        assert not model.tied.elements_by_stage(plan, model._chunks(plan), stages) or schedule != "zbv"


@pytest.mark.parametrize("schedule", ["zbv", "dualpipev"])
def test_the_flat_replay_gives_the_general_replays_floats(schedule):
    """replay_span_s and replay_finish_s run the renumbered one-input replay (replay.py _replay_flat); on random
    durations and sends its finishes are the same floats as the general replay's (which F&B pairs run whole need),
    and a span memoised on (f, b, w) changes with each of them."""
    import random

    from autoplan.cost.pp import replay

    rng = random.Random(7)
    for pp, m in [(2, 4), (3, 7), (4, 8), (5, 13)]:
        steps = replay._v_steps(schedule, pp=pp, m=m, apart=True)
        place = [stage_of_chunk(c, pp=pp, v_shape=True) for c in range(2 * pp)]
        for _ in range(20):
            f, b, w, send = (rng.random() * 10 ** rng.randint(-6, 0) for _ in range(4))
            seconds = replay._durations(f, b, w)
            for send_s in (0.0, send):
                general = replay._replay(steps, seconds=seconds, send_s=send_s)
                assert replay_finish_s(v_order(schedule, pp=pp, m=m), place=place, seconds=seconds, send_s=send_s) == (
                    general
                )
                span = replay.replay_span_s(schedule=schedule, pp=pp, m=m, f=f, b=b, w=w, send_s=send_s)
                assert span == max(general)
        base = replay.replay_span_s(schedule=schedule, pp=pp, m=m, f=1.0, b=1.0, w=1.0)
        for more in (dict(f=2.0, b=1.0, w=1.0), dict(f=1.0, b=2.0, w=1.0), dict(f=1.0, b=1.0, w=2.0)):
            assert replay.replay_span_s(schedule=schedule, pp=pp, m=m, **more) > base
