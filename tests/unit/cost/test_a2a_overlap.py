"""The EP all-to-all overlapped with the other micro-batch's compute (autoplan/cost/moe/a2a_overlap.py), as the
cost model prices it, the search offers it, the executor refuses it where it cannot run it and explain says it
(types/moe_overlap.py)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from synthetic import synthetic_profile
from synthetic.moe import mixtral_graph

from autoplan.cost.model import CostModel
from autoplan.cost.moe.a2a_overlap import COMM_SM_SHARE, alone_units, overlapped_pair_s, paired_share
from autoplan.errors import PlanError
from autoplan.execute.tp_overlap import check_runs_here
from autoplan.report.explain import explain_result
from autoplan.report.moe_overlap import a2a_overlap_why
from autoplan.solve.api import plan_graph
from autoplan.solve.candidates import SearchOptions
from autoplan.solve.search import Search
from autoplan.types.plan import Plan

pytest.importorskip("transformers")
BATCH = 32


@pytest.fixture(scope="module")
def graph():
    return mixtral_graph()  # tests/synthetic/moe.py: traced once per session


@pytest.fixture(scope="module")
def model(graph):
    return CostModel(graph, synthetic_profile())


def _plan(**changes) -> Plan:
    fields = dict(devices=8, dp=8, tp=1, pp=1, ep=8, micro_batch_size=1, num_microbatches=4, precision="bf16")
    return Plan(**{**fields, "runtime": "megatron", **changes})


def test_each_all_to_all_hides_under_the_compute_its_phase_pairs_it_with():
    """Megatron's and DualPipe's four phases: combine's gradient beside the forward's attention, dispatch beside
    the backward's experts, dispatch's gradient beside the forward's experts, combine beside the backward's
    attention; a phase exposes what its compute cannot cover, and at least the SMs it takes (20 of 132)."""
    pair = dict(fwd_compute_s=10.0, bwd_compute_s=20.0, fwd_expert_s=4.0, bwd_expert_s=8.0)
    covered = overlapped_pair_s(fwd_a2a_s=2.0, bwd_a2a_s=2.0, **pair)
    assert covered == pytest.approx(30.0 + COMM_SM_SHARE * 4.0)  # every phase covered: only the SMs' share
    # forward a2a 20 s: dispatch (10) beside the backward's experts (8), combine (10) beside its attention (12)
    # backward a2a 16 s: combine's gradient (8) beside the forward's attention (6), dispatch's (8) beside experts (4)
    exposed = overlapped_pair_s(fwd_a2a_s=20.0, bwd_a2a_s=16.0, **pair) - 30.0
    assert exposed == pytest.approx((10 - 8) + COMM_SM_SHARE * 10 + (8 - 6) + (8 - 4))
    no_experts = overlapped_pair_s(5.0, 3.0, 7.0, 1.0, fwd_expert_s=0.0, bwd_expert_s=0.0, comm_sm_share=0.0)
    assert no_experts == 12.0 + 1.5 + 0.5  # both dispatches have no experts' compute beside them; combines hide
    alone = overlapped_pair_s(0.0, 3.0, 0.0, 1.0, fwd_expert_s=0.0, bwd_expert_s=0.0)
    assert alone == pytest.approx(4.0)  # nothing beside it: all exposed


def test_the_micro_batches_run_alone_are_megatrons_warm_up_and_one_extra():
    assert alone_units(pp=1, virtual_stages=1) == 1  # combined 1F1B without a pipeline: F0, then (F_i+1, B_i)
    assert paired_share(num_microbatches=4, pp=1, virtual_stages=1) == pytest.approx(3 / 4)
    assert alone_units(pp=4, virtual_stages=2) == 2 * 3 + 4 + 1  # get_pp_rank_microbatches' warm-up on rank 0
    assert paired_share(num_microbatches=2, pp=4, virtual_stages=1) == 0.0  # all warm-up: nothing to pair


def test_a_plan_without_the_overlap_prices_its_all_to_all_exposed_as_before(model):
    plan = _plan()
    stages, _, _ = model.priced_stages(plan)
    slowest = max(stages, key=lambda s: s.micro_batch_s)
    assert model.estimate(plan).ep_comm_s == plan.num_microbatches * slowest.ep_s  # m x ep_s, exactly
    assert "moe_a2a_overlap" not in plan.to_dict()  # omitted at its default: plan files stay as they were
    on = _plan(moe_a2a_overlap=True)
    assert Plan.from_dict(on.to_dict()).moe_a2a_overlap and "a2a-overlap" in on.describe()


def test_the_overlap_removes_the_paired_micro_batches_hidden_all_to_all(model):
    plan, on = _plan(), _plan(moe_a2a_overlap=True)
    off_cost, on_cost = model.estimate(plan), model.estimate(on)
    stages, _, _ = model.priced_stages(on)
    block = next(b for b in stages[0].blocks if b.ep_fwd_s > 0)
    assert 0 < block.expert_fwd_s < block.fwd_s and block.expert_bwd_s > 0  # the experts' share of the block
    pair_s = overlapped_pair_s(
        block.fwd_s, block.ep_fwd_s, block.bwd_s, block.ep_bwd_s,
        fwd_expert_s=block.expert_fwd_s, bwd_expert_s=block.expert_bwd_s,
    )  # fmt: skip
    hidden_per_block_s = block.fwd_s + block.bwd_s + block.ep_fwd_s + block.ep_bwd_s - pair_s
    layers = sum(1 for b in stages[0].blocks if b.ep_fwd_s > 0)
    expected_hidden_s = 4 * paired_share(num_microbatches=4, pp=1, virtual_stages=1) * layers * hidden_per_block_s
    assert off_cost.ep_comm_s - on_cost.ep_comm_s == pytest.approx(expected_hidden_s, rel=1e-9)
    assert on_cost.step_time_s == pytest.approx(off_cost.step_time_s - expected_hidden_s, rel=1e-9)
    assert on_cost.compute_s == off_cost.compute_s


def test_the_extra_forward_ahead_of_the_pairs_holds_one_more_micro_batch(model):
    """Megatron's combined 1F1B runs one forward before its first pair: two micro-batches' activations at once
    at pp = 1, and one chunk more on every stage of an interleaved pipeline (get_pp_rank_microbatches)."""
    from autoplan.cost.pp.schedule import in_flight_chunks

    plan, on = _plan(), _plan(moe_a2a_overlap=True)
    assert (in_flight_chunks(plan, 0), in_flight_chunks(on, 0)) == (1.0, 2.0)
    piped = dict(devices=8, dp=4, pp=2, ep=4, schedule="interleaved_1f1b", virtual_stages=2)
    assert in_flight_chunks(_plan(**piped, moe_a2a_overlap=True), 1) == in_flight_chunks(_plan(**piped), 1) + 0.5
    off_cost, on_cost = model.estimate(plan), model.estimate(on)
    stages, _, _ = model.priced_stages(on)
    extra_bytes = on_cost.activations_bytes - off_cost.activations_bytes
    assert extra_bytes == pytest.approx(stages[0].saved_bytes, rel=1e-9)  # one micro-batch's saved activations


def test_a_plan_that_cannot_overlap_is_one_sentence():
    with pytest.raises(PlanError, match="needs ep > 1") as info:
        _plan(ep=1, moe_a2a_overlap=True)
    assert "\n" not in str(info.value)
    with pytest.raises(PlanError, match="full recomputation re-runs the forward"):
        _plan(recompute="full", moe_a2a_overlap=True)


@pytest.mark.parametrize("command", ["run", "launch"])
def test_autoplans_executor_refuses_to_run_an_overlap_it_cannot(tmp_path, capsys, command):
    from autoplan.cli import main

    with pytest.raises(PlanError, match="only in DualPipeV's F&B pairs"):
        check_runs_here(_plan(runtime="autoplan", moe_a2a_overlap=True))  # parallelize's first check
    plan = _plan(devices=2, dp=2, ep=2, runtime="autoplan", moe_a2a_overlap=True).save(tmp_path / "plan.json")
    model = "examples/moe.py"
    argv = {"run": ["run", model, "--plan", str(plan), "--out", str(tmp_path / "run")]}.get(
        command, ["launch", model, str(plan), "--slurm", "--gpus-per-node", "2"]
    )
    assert main(argv) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("autoplan: error:")]
    assert len(errors) == 1 and "set moe_a2a_overlap to false to run here" in errors[0]
    assert not (tmp_path / "run").exists() and not (tmp_path / "launch.sbatch").exists()


def test_the_search_offers_it_only_where_a_runtime_runs_it_and_its_floor_stays_below(graph):
    profile = synthetic_profile(memory_bytes=2**30)
    search = Search(graph, profile, SearchOptions(devices=4, batch_size=BATCH, keep=10**6, runtime="megatron"))
    search._usable_bytes = float("inf")
    search.memory_first = False  # and the time of every plan that does not fit
    priced = [c for c in search.run().candidates if c.cost is not None]
    overlapped = [c.plan for c in priced if c.plan.moe_a2a_overlap]
    assert overlapped and all(p.ep > 1 and p.recompute != "full" and p.precision != "fp32" for p in overlapped)
    assert all(p.pp == 1 or p.virtual_stages > 1 for p in overlapped)  # Megatron's VPP rule at pp > 1
    shares = [
        paired_share(num_microbatches=p.num_microbatches, pp=p.pp, virtual_stages=p.virtual_stages) for p in overlapped
    ]
    assert min(shares) > 0  # never where every micro-batch runs alone (it would change nothing)
    assert any(c.plan.ep > 1 and c.plan.num_microbatches == 1 for c in priced)  # those run only plain
    assert all(c.lower_bound <= c.objective * (1 + 1e-9) for c in priced)  # the floor keeps 20/132 of the a2a
    mine = plan_graph(graph, devices=8, profile=synthetic_profile(), batch_size=BATCH, runtime="autoplan")
    ours = [c.plan for c in mine.candidates if c.plan is not None and c.plan.moe_a2a_overlap]
    assert all(p.schedule == "dualpipev" and p.tp == p.cp == 1 and p.recompute == "none" for p in ours)
    titan = plan_graph(graph, devices=8, profile=synthetic_profile(), batch_size=BATCH, runtime="torchtitan")
    assert not any(c.plan.moe_a2a_overlap for c in titan.candidates if c.plan is not None)


def test_a_pin_runs_where_megatron_runs_it_and_is_one_sentence_elsewhere(graph):
    result = plan_graph(
        graph, devices=8, profile=synthetic_profile(), batch_size=BATCH, runtime="megatron",
        fix="moe_a2a_overlap=on,precision=bf16",
    )  # fmt: skip
    assert result.best.moe_a2a_overlap and result.best.ep > 1
    said = explain_result(result, graph=graph, profile=synthetic_profile(), sensitivity=False)
    assert said.a2a_overlap.startswith("moe_a2a_overlap runs each expert-parallel all-to-all beside")
    assert "**All-to-all overlap:**" in said.to_markdown()
    with pytest.raises(PlanError, match="runtime 'torchtitan', which cannot overlap") as info:
        plan_graph(
            graph, devices=8, profile=synthetic_profile(), batch_size=BATCH, runtime="torchtitan",
            fix="moe_a2a_overlap=on",
        )  # fmt: skip
    assert "\n" not in str(info.value)
    with pytest.raises(PlanError, match="only in DualPipeV's F&B pairs; pin schedule=dualpipev"):
        plan_graph(
            graph, devices=8, profile=synthetic_profile(), batch_size=BATCH, fix="moe_a2a_overlap=on,schedule=1f1b"
        )


def test_under_dualpipev_autoplan_is_offered_the_overlap_beside_the_plain_plan_and_runs_it(graph):
    """Runtime autoplan, schedule pinned to dualpipev: every plan its executor can overlap (ep > 1, tp 1, ZeRO 0/1,
    no or selective recompute) is priced overlapped beside itself plain, the others plain only; the overlapped one
    hides part of its all-to-all and is picked, and the executor's checks accept it (execute/overlap_f_b.py)."""
    result = plan_graph(
        graph, devices=8, profile=synthetic_profile(), batch_size=BATCH, runtime="autoplan", fix="schedule=dualpipev"
    )
    priced = [c for c in result.candidates if c.plan is not None and c.cost is not None]
    overlapped = [c for c in priced if c.plan.moe_a2a_overlap]
    plain = {c.plan.describe(): c for c in priced if not c.plan.moe_a2a_overlap}
    assert overlapped and all(c.plan.zero_stage <= 1 and c.plan.recompute != "full" for c in overlapped)
    assert any(c.plan.recompute == "selective" for c in overlapped)  # a re-run block sends no all-to-all again
    assert any(c.plan.zero_stage >= 2 for c in plain.values())  # plain only
    for c in overlapped:  # its twin, the same plan without the overlap, priced too
        twin = plain[replace(c.plan, moe_a2a_overlap=False).describe()]
        assert 0 < c.cost.ep_comm_s < twin.cost.ep_comm_s
    assert result.best.moe_a2a_overlap and result.best.schedule == "dualpipev"
    check_runs_here(result.best)  # parallelize's first check: no refusal


@pytest.mark.parametrize(
    "changes, said",
    [
        (dict(tp=2, dp=2, sequence_parallel=True), "not at tp=2"),
        (dict(zero_stage=2), "not at zero_stage=2"),
        (dict(schedule="1f1b", virtual_stages=1), "only in DualPipeV's F&B pairs"),
    ],
)
def test_autoplans_executor_runs_the_overlap_only_where_no_other_collective_shares_the_halves(changes, said):
    """One sentence per condition of types/moe_overlap.py ``executor_refusal``, before a rank starts; the plan that
    meets them all runs (tests/dist/test_moe_a2a_overlap.py)."""
    fields = dict(devices=8, dp=4, pp=2, ep=2, num_microbatches=4, schedule="dualpipev", virtual_stages=2)
    check_runs_here(_plan(runtime="autoplan", moe_a2a_overlap=True, **fields))
    with pytest.raises(PlanError, match=said) as info:
        check_runs_here(_plan(runtime="autoplan", moe_a2a_overlap=True, **{**fields, **changes}))
    assert "\n" not in str(info.value) and str(info.value).endswith("set moe_a2a_overlap to false to run here.")


def test_autoplans_executor_runs_the_overlap_beside_selective_recompute_budgeted_or_not_never_full():
    """A block re-run in a pair's backward half keeps its all-to-alls' outputs (types/saved_ops.py), so selective
    recomputation, on every block or the first k of each chunk, runs overlapped; full is refused at the plan."""
    fields = dict(devices=8, dp=4, pp=2, ep=2, num_microbatches=4, schedule="dualpipev", virtual_stages=2)
    check_runs_here(_plan(runtime="autoplan", moe_a2a_overlap=True, recompute="selective", **fields))
    budget = dict(recompute="selective", recompute_blocks=[1, 0, 1, 0])
    check_runs_here(_plan(runtime="autoplan", moe_a2a_overlap=True, **budget, **fields))
    with pytest.raises(PlanError, match="recompute='full'"):
        _plan(runtime="autoplan", moe_a2a_overlap=True, recompute="full", **fields)


def test_explain_says_what_the_overlap_hides_and_what_the_step_takes_without_it(model):
    on = _plan(moe_a2a_overlap=True)
    cost, exposed = model.estimate(on), model.estimate(replace(on, moe_a2a_overlap=False))
    said = a2a_overlap_why(model, on, cost)
    assert "hides" in said and "leaves" in said and "with it exposed the step takes" in said
    from autoplan.display import duration_text

    assert duration_text(exposed.ep_comm_s - cost.ep_comm_s) in said and duration_text(exposed.step_time_s) in said
    assert a2a_overlap_why(model, _plan(), exposed) == ""


def test_trainers_without_the_switch_say_the_all_to_all_runs_exposed_there():
    from autoplan.export import deepspeed, megatron
    from autoplan.export import torchtitan as titan
    from autoplan.export.common import ModelFacts
    from autoplan.export.torchtitan_flavours import Flavour, Registry, facts_shape

    facts = ModelFacts(
        name="llama", layers=8, hidden_size=256, num_heads=8, num_kv_heads=8, seq_len=128, vocab_size=512
    )
    flavours = [Flavour("llama3", "debugmodel", None, facts_shape(facts))]
    registry = Registry(version="0.2.2", flavours=flavours, input_modules=["tok_embeddings"], output_modules=["norm"])
    on = _plan(ep=2, moe_a2a_overlap=True)
    for exported in (titan.export(on, facts, fmt="toml", registry=registry), deepspeed.export(on, facts)):
        assert any(n.startswith("moe_a2a_overlap:") and "runs exposed there" in n for n in exported.unexpressed)
    assert not any("moe_a2a_overlap" in n for n in megatron.export(on, facts).unexpressed)  # its own flag
    assert not any("moe_a2a_overlap" in n for n in deepspeed.export(_plan(ep=2), facts).unexpressed)
