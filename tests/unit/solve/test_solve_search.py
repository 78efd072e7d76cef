"""The outer search: known answers, pins, bounds, exhaustiveness and no-fit messages."""

import pytest
from synthetic import synthetic_gpt, synthetic_profile

from autoplan.cost.network.mesh import mesh_groups
from autoplan.cost.tp.splits import tp_layer_cost
from autoplan.errors import PlanError
from autoplan.solve import sequence_parallel, space
from autoplan.solve.api import NoPlanFits, plan_graph
from autoplan.solve.candidates import SearchOptions
from autoplan.solve.pins import parse_fixes
from autoplan.solve.search import Search
from autoplan.solve.stage_costs import StageCosts


def _tiny():
    return synthetic_gpt(layers=4, hidden=256, heads=8, vocab=8000, seq=128, batch=16)


def test_tiny_model_on_eight_devices_is_pure_data_parallel():
    best = plan_graph(_tiny(), devices=8, profile=synthetic_profile(), batch_size=16).best
    assert (best.dp, best.tp, best.pp) == (8, 1, 1)
    assert best.predicted.step_time_s > 0 and 0 < best.predicted.mfu < 1


def test_model_too_large_for_one_device_gets_tp_or_pp():
    graph = synthetic_gpt(layers=8, hidden=4096, heads=32, vocab=32000, seq=1024, batch=8)  # ~1.9e9 params
    profile = synthetic_profile(memory_bytes=16 * 2**30)  # 16 B/param needs ~30 GiB
    best = plan_graph(graph, devices=8, profile=profile, batch_size=8, fix={"zero": 0}).best
    assert best.tp > 1 or best.pp > 1
    assert best.predicted.peak_memory_bytes <= profile.device.memory_bytes


def test_tp_stays_inside_a_node_when_links_between_nodes_are_slow():
    graph = synthetic_gpt(layers=8, hidden=2048, heads=16, vocab=32000, seq=1024, batch=8)
    profile = synthetic_profile(devices_per_node=4, inter_busbw_bytes_per_s=2e9)
    result = plan_graph(graph, devices=16, profile=profile, batch_size=8)
    for c in result.candidates:
        if c.status == "evaluated":
            assert not mesh_groups(profile, dp=c.plan.dp, tp=c.plan.tp, pp=c.plan.pp)["tp"].spans_nodes
    in_node = plan_graph(graph, devices=16, profile=profile, batch_size=8, fix={"tp": 4}).best_cost
    across = plan_graph(graph, devices=16, profile=profile, batch_size=8, fix={"tp": 8}).best_cost
    assert across.step_time_s > in_node.step_time_s


def test_heads_that_do_not_divide_tp_are_never_split():
    graph = synthetic_gpt(layers=2, hidden=384, heads=6, vocab=8000, seq=128, batch=16)
    profile = synthetic_profile()
    candidates = [
        c
        for tp in (4, 8)
        for c in plan_graph(graph, devices=8, profile=profile, batch_size=16, fix={"tp": tp}).candidates
    ]
    seen_tp = set()
    for c in candidates:
        if c.status != "evaluated" or 6 % c.plan.tp == 0:
            continue
        seen_tp.add(c.plan.tp)
        for layer in graph.layers:
            assert all(c.plan.tp_plan.get(f"{layer}.attn.{p}") != "colwise" for p in "qkv")
            ctx = StageCosts(graph, profile).context(c.plan)
            assert tp_layer_cost(graph, layer, c.plan.tp_plan, ctx=ctx).compute_shard[f"{layer}.attn.sdpa"] == 1
    assert seen_tp == {4, 8}


def test_fixes_are_honoured():
    pins = "dp=2,tp=2,pp=2,mbs=1,zero=1,recompute=full,schedule=1f1b,sp=on,precision=bf16"
    result = plan_graph(_tiny(), devices=8, profile=synthetic_profile(), batch_size=16, fix=pins)
    best = result.best
    assert (best.dp, best.tp, best.pp, best.micro_batch_size, best.zero_stage) == (2, 2, 2, 1, 1)
    assert (best.recompute, best.schedule, best.sequence_parallel, best.precision) == ("full", "1f1b", True, "bf16")
    assert all(c.config["tp"] == 2 and c.config["recompute"] in ("full", "*") for c in result.candidates)


def test_bounds_never_exceed_the_priced_objective():
    result = plan_graph(_tiny(), devices=8, profile=synthetic_profile(), batch_size=16)
    evaluated = [c for c in result.candidates if c.status == "evaluated"]
    assert evaluated and result.pruned > 0
    assert all(c.lower_bound <= c.objective * (1 + 1e-9) for c in evaluated)


def test_the_memory_floor_never_exceeds_the_priced_peak():
    """bounds.states_floor_bytes is a lower bound on CostModel's peak for every plan, whatever its
    partition, so setting aside plans whose floor exceeds the device loses no plan that fits. On 4 devices
    (3,606 plans priced; 16 devices priced 24,299 in 6x the CPU) every factor of the floor varies: dp x cp,
    tp, pp, ZeRO stage, precision; a floor that ignores dp x cp's sharing or reads fp32 states at bf16 fails
    here as on 16 devices, and tightness below catches one that is too low."""
    graph = synthetic_gpt(layers=8, hidden=4096, heads=32, vocab=32000, seq=1024, batch=32)
    search = Search(
        graph, synthetic_profile(memory_bytes=12 * 2**30), SearchOptions(devices=4, batch_size=32, keep=10**6)
    )
    search._usable_bytes = float("inf")
    search.memory_first = False  # and the time of every plan that does not fit
    result = search.run()
    priced = [c for c in result.candidates if c.cost is not None]
    assert len(priced) > 100 and any(not c.cost.feasible for c in priced) and any(c.plan.pp > 1 for c in priced)
    assert all(search.bounds.states_floor_bytes(c.plan) <= c.cost.peak_memory_bytes * (1 + 1e-12) for c in priced)
    tight = max(search.bounds.states_floor_bytes(c.plan) / c.cost.peak_memory_bytes for c in priced)
    assert tight > 0.5  # a floor, but not a vacuous one


def test_plans_that_cannot_fit_are_set_aside_with_the_reason():
    graph = synthetic_gpt(layers=8, hidden=4096, heads=32, vocab=32000, seq=1024, batch=32)
    result = plan_graph(graph, devices=16, profile=synthetic_profile(memory_bytes=12 * 2**30), batch_size=32)
    aside = [c for c in result.candidates if c.reason.startswith("pruned (memory)")]
    assert aside and all("GiB per device" in c.reason for c in aside)  # by its floor, or its priced memory
    assert any("GiB per device under any partition" in c.reason for c in aside)


def test_search_is_exhaustive_where_it_prunes():
    """The pruned search ranks the same top plans as pricing every configuration."""
    graph, profile = synthetic_gpt(layers=4, hidden=512, heads=8, vocab=8000, seq=256, batch=8), synthetic_profile()
    options = SearchOptions(devices=8, batch_size=8, keep=3)
    pruned = Search(graph, profile, options).run()
    everything = Search(graph, profile, options)
    everything._beaten = lambda bound: False  # price every candidate
    everything._usable_bytes = float("inf")  # whatever its memory floor
    everything.memory_first = False  # and the time of every plan that does not fit
    full = everything.run()
    degenerate = sum(c.count for c in full.candidates if "splits no op" in c.reason)  # pruned by rule, not by bound

    def one_step(result, status: str) -> int:  # a larger schedule step has a row only where priced (schedule_steps.py)
        return sum(c.count for c in result.candidates if c.status == status and "schedule_steps" not in c.config)

    assert full.pruned == degenerate
    assert one_step(full, "evaluated") + degenerate == one_step(pruned, "evaluated") + one_step(pruned, "pruned")
    assert pruned.pruned > 0
    top = [c.objective for c in pruned.ranked()[:3]]
    assert top == pytest.approx([c.objective for c in full.ranked()[:3]], rel=1e-12)


def test_cost_objective_may_use_fewer_devices():
    profile = synthetic_profile()
    cheapest = plan_graph(_tiny(), devices=8, profile=profile, batch_size=16, objective="cost").best
    fastest = plan_graph(_tiny(), devices=8, profile=profile, batch_size=16).best
    assert cheapest.devices < 8  # a tiny model scales sub-linearly: fewer devices cost less
    assert cheapest.predicted.cost_per_step_usd < fastest.predicted.cost_per_step_usd
    assert cheapest.predicted.step_time_s > fastest.predicted.step_time_s


def test_nothing_fits_names_the_devices_that_would():
    graph = synthetic_gpt(layers=4, hidden=4096, heads=32, vocab=32000, seq=512, batch=8)
    profile = synthetic_profile(memory_bytes=4 * 2**30)
    with pytest.raises(NoPlanFits) as info:
        plan_graph(graph, devices=2, profile=profile, batch_size=8)
    message = str(info.value)
    assert "no plan fits" in message and "devices" in message and "\n" not in message
    assert info.value.result is not None and not info.value.result.ranked()


@pytest.mark.parametrize(
    "kwargs, words",
    [
        (dict(devices=12), "whole nodes of 8"),
        (dict(devices=8, fix="dp=3"), "satisfies --fix dp=3"),
        (dict(devices=8, fix="tpp=2"), "KEY=VALUE"),
        (dict(devices=8, fix="zero=5"), "zero=5"),
        (dict(devices=8, objective="speed"), "objective"),
    ],
)
def test_bad_input_is_one_sentence(kwargs, words):
    with pytest.raises(PlanError) as info:
        plan_graph(_tiny(), profile=synthetic_profile(), batch_size=16, **kwargs)
    assert words in str(info.value) and "\n" not in str(info.value)


def test_space_rules():
    assert parse_fixes(["dp=2,sp=on", "schedule=interleaved"]) == {"dp": 2, "sp": True, "schedule": "interleaved_1f1b"}
    degrees = space.degree_options(devices=16, per_node=8, layers=4, batch=16, fixes={})
    assert all(d.tp in (1, 2, 4, 8) and d.pp <= 4 and d.dp * d.tp * d.pp == 16 for d in degrees)
    assert ("interleaved_1f1b", 2) in space.schedule_options(pp=2, layers=4, num_microbatches=4, fixes={})
    assert ("interleaved_1f1b", 2) not in space.schedule_options(pp=2, layers=4, num_microbatches=3, fixes={})
    assert sequence_parallel.sp_options(tp=1, seq_lens=(128,), fixes={}) == [False]


def test_memory_row_of_the_ilp_rescues_a_group_that_only_fits_split():
    """Slow links make replicated blocks fastest; with little memory the ILP's memory row
    must shard some weights instead, and the plan then fits."""
    graph = synthetic_gpt(layers=4, hidden=4096, heads=32, vocab=32000, seq=512, batch=8)
    pins = {"tp": 8, "zero": 0, "pp": 1, "precision": "bf16"}
    roomy = plan_graph(
        graph,
        devices=8,
        profile=synthetic_profile(memory_bytes=160 * 2**30, intra_busbw_bytes_per_s=2e9),
        batch_size=8,
        fix=pins,
    ).best
    assert all(split == "replicate" for module, split in roomy.tp_plan.items() if module.startswith("h."))
    tight_profile = synthetic_profile(memory_bytes=16 * 2**30, intra_busbw_bytes_per_s=2e9)
    tight = plan_graph(graph, devices=8, profile=tight_profile, batch_size=8, fix=pins).best
    assert any(split != "replicate" for module, split in tight.tp_plan.items() if module.startswith("h."))
    assert tight.predicted.peak_memory_bytes <= 0.9 * tight_profile.device.memory_bytes


def test_a_memory_budget_with_nothing_left_is_a_reason_not_a_crash():
    # tight memory: the memory-constrained TP ILP gets a negative per-block budget for some groups
    # (PuLP would raise "Cannot set constraint RHS to NaN/inf" for a NaN one); they are infeasible with a reason.
    graph = synthetic_gpt(layers=4, hidden=1024, heads=16, batch=64, seq=512)
    profile = synthetic_profile(inter_busbw_bytes_per_s=200e9, memory_bytes=300 * 10**6)
    result = Search(graph, profile, SearchOptions(devices=16, batch_size=64)).run()
    reasons = [c.reason for c in result.candidates if "tp ILP infeasible" in c.reason]
    assert reasons and all(not c.feasible for c in result.candidates if "tp ILP infeasible" in c.reason)
    assert "budget" in reasons[0] and "\n" not in reasons[0]


def test_a_profile_given_as_a_file_is_recorded_by_its_path(tmp_path):
    """run --audit and calibrate load the plan's profile again: a file is found only by its path."""
    from pathlib import Path

    from autoplan.profile import load_profile, save_profile

    path = save_profile(synthetic_profile(name="my-cluster"), tmp_path / "my-cluster.yaml")
    best = plan_graph(_tiny(), devices=8, profile=str(path), batch_size=16).best
    assert best.profile == str(Path(path).resolve())
    assert load_profile(best.profile).name == "my-cluster"
    assert plan_graph(_tiny(), devices=8, profile=synthetic_profile(), batch_size=16).best.profile == "synthetic-a100"


def test_1f1b_needs_as_many_micro_batches_as_stages_searched_pinned_and_run():
    """torch's Schedule1F1B refuses m < pp: the search offers gpipe alone there, a 1f1b pin picks a micro-batch
    size with m >= pp, and a hand-made plan is refused in one sentence before a rank starts."""
    from autoplan.execute.tp_overlap import check_runs_here
    from autoplan.types.plan import Plan

    assert space.schedule_options(pp=2, layers=4, num_microbatches=1, fixes={}) == [("gpipe", 1)]
    assert ("1f1b", 1) in space.schedule_options(pp=2, layers=4, num_microbatches=2, fixes={})
    assert ("1f1b", 1) in space.schedule_options(pp=2, layers=4, num_microbatches=1, fixes={}, runtime="megatron")
    graph = synthetic_gpt(layers=4, hidden=64, heads=4, vocab=128, seq=16, batch=4)
    best = plan_graph(graph, devices=2, profile="cpu-gloo", batch_size=4, fix={"pp": 2, "schedule": "1f1b"}).best
    assert best.schedule == "1f1b" and best.num_microbatches >= 2
    with pytest.raises(PlanError, match="Schedule1F1B needs at least pp micro-batches"):
        check_runs_here(Plan(devices=2, dp=1, tp=1, pp=2, micro_batch_size=4, num_microbatches=1, schedule="1f1b"))
