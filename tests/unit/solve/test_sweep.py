"""autoplan.sweep on a synthetic cluster whose cheapest and fastest choices are known by
construction (solve/cluster.py): two instances with the same device and node, one cheap with a slow
network and one at twice the price with a fast network, and an old instance (half the compute)
that costs more than either. Within a node the two first step alike, so the cheap one is cheaper;
across nodes only the fast network keeps scaling; the old one is dominated everywhere."""

from __future__ import annotations

from dataclasses import replace

import pytest

from autoplan.errors import PlanError, ProfileError
from autoplan.solve import cluster as sweep_module
from autoplan.solve.api import NoPlanFits, plan_graph
from autoplan.solve.cluster import NoClusterMeets, device_counts, recommend, sweep_graph
from autoplan.types.run import RunSpec
from tests.synthetic.graphs import synthetic_gpt
from tests.synthetic.profiles import rental_profile, synthetic_profile

TOKENS = 1e10
CHEAP = rental_profile(name="cheap-slow", price=1.0, inter_busbw_bytes_per_s=5e9)
FAST = rental_profile(name="dear-fast", price=2.0, inter_busbw_bytes_per_s=100e9)
OLD = rental_profile(name="old-dear", price=3.0, inter_busbw_bytes_per_s=100e9, flops_scale=0.5)
#: a sweep plans the powers of two in a range (device_counts): 1 to 8 inside one node, where the two instances
#: step alike, and 16 to 128 across nodes, where only the fast network keeps scaling; each count is a point the
#: exhaustive sweep (prune=False) plans and the pruned one is held to
DEVICES = range(1, 129)


@pytest.fixture(scope="module")
def graph():
    """Two blocks: every point's search is the same code over fewer stage cuts (the cheap instance's searches past
    one node were most of this module's CPU: 13.4 of 22 s at 4 blocks, 8.3 of 15.3 s at 2), and the built-in order
    holds as at 4 (the cheap instance cheapest on one node, slower on two; the fast one fastest at 128; the old one
    dominated everywhere)."""
    return synthetic_gpt(layers=2, hidden=1024, heads=16, seq=1024, batch=256)


@pytest.fixture(scope="module")
def planned():
    """plan_graph as the sweeps of this module call it, each distinct call made once: a point's search is a pure
    function of its arguments (the graph, the count, the profile, the run), and the pruned sweep plans a subset
    of the full one's points (this module 38.4 -> 32.0 s user CPU, one alternated run). What each sweep counts
    and prunes is its own: only the searches it asks for are shared."""
    made: dict[str, object] = {}

    def plan_once(graph, **kw):
        key = f"{id(graph)} {sorted(kw.items())!r}"  # the profile's repr holds every number of it
        if key not in made:
            made[key] = plan_graph(graph, **kw)
        return made[key]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sweep_module, "plan_graph", plan_once)
        yield plan_once


@pytest.fixture(scope="module")
def full(graph, planned):
    return sweep_graph(graph, devices=DEVICES, profiles=[CHEAP, FAST, OLD], run={"tokens": TOKENS}, prune=False)


@pytest.fixture(scope="module")
def pruned(graph, planned):
    return sweep_graph(graph, devices=DEVICES, profiles=[CHEAP, FAST, OLD], run={"tokens": TOKENS})


def _find(result, profile, devices):
    return next(r for r in result.rows if r.profile == profile and r.devices == devices)


def _front(result):
    return [(r.profile, r.devices, round(r.wall_h, 9), round(r.dollars, 6)) for r in result.pareto]


def test_device_counts_are_powers_of_two_in_the_range():
    assert device_counts(range(8, 1025)) == [8, 16, 32, 64, 128, 256, 512, 1024]
    assert device_counts("3..20") == [4, 8, 16]
    assert device_counts([64, 16, "16"]) == [16, 64]
    with pytest.raises(PlanError, match="8..1024"):
        device_counts("5..7")


def test_the_cheapest_and_the_fastest_are_the_ones_built_in(full):
    planned = full.planned
    assert len(planned) == full.grid_size == full.plan_calls == 24
    cheapest = min(planned, key=lambda r: r.dollars)
    fastest = min(planned, key=lambda r: r.wall_h)
    assert (cheapest.profile, cheapest.devices) == ("cheap-slow", 8)  # a whole instance, cheap, no network
    assert (fastest.profile, fastest.devices) == ("dear-fast", 128)
    for n in (1, 2, 4, 8):  # inside a node the two instances step alike; the cheap one costs half
        cheap, fast = _find(full, "cheap-slow", n), _find(full, "dear-fast", n)
        assert cheap.wall_h == pytest.approx(fast.wall_h)
        assert cheap.dollars == pytest.approx(fast.dollars / 2)
        assert cheap.estimate.billed_devices == 8  # below one instance, the whole instance is billed
    assert _find(full, "cheap-slow", 16).wall_h > _find(full, "cheap-slow", 8).wall_h  # the slow network
    assert not any(r.pareto for r in planned if r.profile == "old-dear")


def test_the_front_is_exactly_the_non_dominated_points(full):
    planned = full.planned

    def dominated(row):
        return any(
            o.wall_h <= row.wall_h and o.dollars <= row.dollars and (o.wall_h, o.dollars) != (row.wall_h, row.dollars)
            for o in planned
        )

    assert {id(r) for r in full.pareto} == {id(r) for r in planned if not dominated(r)}
    times = [r.wall_h for r in full.pareto]
    dollars = [r.dollars for r in full.pareto]
    assert times == sorted(times) and dollars == sorted(dollars, reverse=True)
    assert ("cheap-slow", 8) in [(r.profile, r.devices) for r in full.pareto]


def test_pruning_plans_fewer_points_and_keeps_the_front(full, pruned):
    assert pruned.plan_calls < full.plan_calls == pruned.grid_size
    assert _front(pruned) == _front(full)
    reasons = [r.reason for r in pruned.rows if r.status == "pruned"]
    assert any(reason.startswith("pruned (growth)") for reason in reasons)
    assert any(reason.startswith("pruned (dominated)") for reason in reasons)  # the old instance
    assert pruned.recommendation == full.recommendation


def test_pruning_counts_plan_graph_calls(graph, planned, monkeypatch):
    calls = []
    monkeypatch.setattr(sweep_module, "plan_graph", lambda *a, **k: calls.append(k["devices"]) or planned(*a, **k))
    result = sweep_graph(graph, devices=range(8, 65), profiles=[CHEAP, FAST], run={"tokens": TOKENS})
    assert len(calls) == result.plan_calls < result.grid_size == 8


def _recommend(result, **spec):
    again = replace(result, spec=RunSpec(tokens=TOKENS, **spec), recommendation="", rule="", recommended=None)
    recommend(again)
    return again


def test_without_constraints_the_cheapest_within_a_quarter_of_the_fastest(full):
    fastest = min(r.wall_h for r in full.planned)
    expected = min((r for r in full.planned if r.wall_h <= 1.25 * fastest), key=lambda r: r.dollars)
    assert full.recommended is expected and expected.profile == "dear-fast"
    assert full.recommendation.startswith(f"Rent {expected.devices} x dear-fast (")
    assert "the cheapest within 1.25x of the fastest" in full.recommendation
    assert "the cheapest, 8 x cheap-slow, takes" in full.recommendation
    assert full.recommendation.endswith(".") and ". " not in full.recommendation  # one sentence


def test_a_deadline_picks_the_cheapest_that_meets_it(full):
    cheap8 = _find(full, "cheap-slow", 8)
    deadline = 0.9 * cheap8.wall_h  # the cheap instance never gets faster than on one node
    result = _recommend(full, deadline_h=deadline)
    meets = [r for r in full.planned if r.wall_h <= deadline]
    assert result.recommended is min(meets, key=lambda r: r.dollars)
    assert result.recommended.profile == "dear-fast" and "deadline" in result.rule


def test_a_budget_picks_the_fastest_within_it(full):
    cheap8 = _find(full, "cheap-slow", 8)
    result = _recommend(full, budget_usd=1.01 * cheap8.dollars)
    assert result.recommended is cheap8 and result.rule.startswith("the fastest within the $")
    roomy = _recommend(full, budget_usd=1e9)
    assert roomy.recommended is min(full.planned, key=lambda r: r.wall_h)


def test_unmet_constraints_say_what_to_change(full):
    fastest = min(full.planned, key=lambda r: r.wall_h)
    with pytest.raises(NoClusterMeets, match="the fastest, 128 x dear-fast.*sweep more than 128 devices"):
        _recommend(full, deadline_h=0.5 * fastest.wall_h)
    cheapest = min(full.planned, key=lambda r: r.dollars)
    with pytest.raises(NoClusterMeets, match=r"the cheapest, 8 x cheap-slow, costs .*raise --budget to \$"):
        _recommend(full, budget_usd=0.5 * cheapest.dollars)


def test_bad_input_fails_in_one_sentence(graph):
    with pytest.raises(ProfileError, match="unknown profile or instance 'p9'; use one of: .*aws-p5"):
        sweep_graph(graph, devices=[8], profiles=["p9"], run={"tokens": TOKENS})
    unpriced = replace(synthetic_profile(name="unpriced"), pricing=None)
    with pytest.raises(PlanError, match="profile 'unpriced' has no pricing section; pass --price-per-device-hour"):
        sweep_graph(graph, devices=[8], profiles=[unpriced], run={"tokens": TOKENS})
    with pytest.raises(PlanError, match="--price-per-device-hour -2"):
        sweep_graph(graph, devices=[8], profiles=[CHEAP], run={"tokens": TOKENS, "price_per_device_hour": -2})
    with pytest.raises(PlanError, match="--tokens N or --steps N"):
        sweep_graph(graph, devices=[8], profiles=[CHEAP], run={})


def test_plan_with_an_unreachable_deadline_names_the_cluster_that_meets_it(graph, full):
    """The deadline between the fast instance's runs on 16 and 32 devices, as the exhaustive sweep planned them
    (plan_graph on each count, without deadline or budget: the same searches this test made again)."""
    on16, on32 = _find(full, "dear-fast", 16).estimate, _find(full, "dear-fast", 32).estimate
    deadline = (on16.wall_h + on32.wall_h) / 2
    with pytest.raises(NoPlanFits, match="the smallest cluster that meets it is 32 devices: plan with --devices 32"):
        plan_graph(graph, devices=16, profile=FAST, run=RunSpec(tokens=TOKENS, deadline_h=deadline))
    with pytest.raises(NoPlanFits, match=r"raise --budget to \$"):
        plan_graph(graph, devices=16, profile=FAST, run=RunSpec(tokens=TOKENS, budget_usd=on16.dollars / 2))
    met = plan_graph(graph, devices=16, profile=FAST, run=RunSpec(tokens=TOKENS, budget_usd=on16.dollars * 1.01))
    assert met.best.predicted.run.cost_usd == pytest.approx(on16.cost_usd)


def test_cost_objective_over_the_whole_run_counts_whole_instances(graph):
    """--objective cost also tries fewer devices; with whole instances billed, fewer than one
    instance is never cheaper than a full one."""
    best = plan_graph(graph, devices=32, profile=CHEAP, objective="cost", run=RunSpec(tokens=TOKENS)).best
    assert best.devices == 8 and best.predicted.run.billed_devices == 8


@pytest.mark.parametrize("width", [80, 120])
def test_the_pareto_table_prints_every_number_whole(pruned, width):
    import io

    from rich.console import Console

    from autoplan.solve.console import pareto_table

    table = pareto_table(pruned)
    console = Console(width=width, file=io.StringIO(), color_system=None)
    console.print(table)
    text = console.file.getvalue()
    assert "…" not in text
    numeric = [i for i, h in enumerate(table.headers) if h in table.numbers]
    assert all(row[i] in text for row in table.rows for i in numeric), text
