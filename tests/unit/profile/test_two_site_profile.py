"""The two-site profile (issue 36 item 4): sites of nodes joined by a wide-area link (types/sites.py),
validated, priced where a group crosses them, and the planner compressing gradients only where that pays,
with explain saying by how much."""

import copy
import re

import pytest
from synthetic import synthetic_gpt

from autoplan.cost import CostModel
from autoplan.cost.network.comm import collective_time_s
from autoplan.cost.network.mesh import AxisGroup, mesh_groups
from autoplan.errors import ProfileError
from autoplan.profile import load_profile
from autoplan.report.explain import explain
from autoplan.solve.api import plan_graph
from autoplan.types import Plan
from autoplan.types.profile import Profile

SITE = 32  # devices per site in profiles/two-site-h100.yaml (4 nodes of 8)


@pytest.fixture(scope="module")
def two_site():
    return load_profile("two-site-h100")


def test_the_profile_says_where_its_sites_and_wan_figures_come_from(two_site):
    assert two_site.sites.nodes_per_site * two_site.devices_per_node == SITE
    for fit in two_site.sites.link.collectives.values():
        assert "100 Gb/s" in fit.source and "azure-network-latency" in fit.source
    assert Profile.from_dict(two_site.to_dict()) == two_site
    assert "sites" not in load_profile("dgx-h100").to_dict()  # a profile without sites is written as before


@pytest.mark.parametrize(
    "change, words",
    [
        (lambda d: d["sites"].update(nodes_per_site=0), "'sites.nodes_per_site' is 0; expected an integer >= 1"),
        (lambda d: d["sites"]["link"]["collectives"].pop("all_gather"), "'sites.link.collectives' has no 'all_gather'"),
    ],
)
def test_a_bad_sites_section_gets_one_sentence(two_site, change, words):
    data = copy.deepcopy(two_site.to_dict())
    change(data)
    with pytest.raises(ProfileError, match=re.escape(words)):
        Profile.from_dict(data)


def test_only_groups_that_cross_a_site_pay_the_wide_area_link(two_site):
    inside = mesh_groups(two_site, dp=SITE, tp=1, pp=1)["dp"]
    across = mesh_groups(two_site, dp=2 * SITE, tp=1, pp=1)["dp"]
    assert (inside.sites, across.sites, across.ranks_per_site) == (1, 2, SITE)
    pp_pair = mesh_groups(two_site, dp=SITE, tp=1, pp=2)["pp"]  # each pipeline stage in its own site
    assert pp_pair.sites == 2 and mesh_groups(two_site, dp=2 * SITE, tp=1, pp=1)["tp"].sites == 1
    message, inter = 100e6, two_site.link(True).collectives["all_reduce"]
    within = collective_time_s(two_site, "all_reduce", message, group=AxisGroup(size=2 * SITE, ranks_per_node=8))
    wan, c = two_site.sites.link.collectives["all_reduce"], 2 * (2 * SITE - 1) / (2 * SITE)
    extra_s = wan.alpha_s + c * message / wan.busbw_bytes_per_s - c * message / inter.busbw_bytes_per_s
    assert collective_time_s(two_site, "all_reduce", message, group=across) == pytest.approx(within + extra_s)


def test_a_profile_without_sites_prices_as_before(two_site):
    flat = copy.deepcopy(two_site)
    flat.sites = None
    graph = synthetic_gpt(layers=2, hidden=256, heads=8, vocab=8000, seq=256, batch=64)
    plan = Plan(devices=64, dp=64, tp=1, pp=1, micro_batch_size=1, num_microbatches=1, precision="bf16")
    dgx = CostModel(graph, load_profile("dgx-h100")).estimate(plan)
    assert CostModel(graph, flat).estimate(plan).step_time_s == dgx.step_time_s
    assert CostModel(graph, two_site).estimate(plan).dp_comm_s > 10 * dgx.dp_comm_s


def _graph():
    """5.7M parameters and 512 sequences of 1024 tokens: little compute per step, gradients to sync."""
    return synthetic_gpt(layers=2, hidden=256, heads=8, vocab=8000, seq=1024, batch=512)


@pytest.fixture(scope="module")
def searched(two_site):
    graph, fix = _graph(), {"tp": 1, "pp": 1, "sync_every": 1}  # compression only: DiLoCo is priced below
    found = {}
    for devices in (SITE, 2 * SITE):
        for lossy in (False, True):
            found[devices, lossy] = plan_graph(
                graph, devices=devices, profile=two_site, batch_size=512, fix=fix, allow_lossy=lossy
            )
    return graph, found


def test_the_planner_compresses_only_where_the_gradient_sync_crosses_the_wan(searched):
    _, found = searched
    across, exact = found[2 * SITE, True].best, found[2 * SITE, False].best
    assert across.grad_compression != "none"
    assert across.predicted.step_time_s < exact.predicted.step_time_s
    inside = found[SITE, True].best  # one site: InfiniBand, the sync is cheap, compression does not pay
    assert inside.grad_compression == "none"
    for result in found.values():  # the search's bounds stay below the prices across the wide-area link
        evaluated = [c for c in result.candidates if c.status == "evaluated"]
        assert all(c.lower_bound <= c.objective * (1 + 1e-9) for c in evaluated)


def test_explain_says_by_how_much_compression_pays(searched, two_site):
    graph, found = searched
    result = found[2 * SITE, True]
    exp = explain(result, graph=graph, profile=two_site, sensitivity=False)
    fix = {"tp": 1, "pp": 1, "grad_compression": "none", "sync_every": 1}
    uncompressed = plan_graph(graph, devices=2 * SITE, profile=two_site, batch_size=512, fix=fix, allow_lossy=True)
    best, rival = result.best.predicted.step_time_s, uncompressed.best.predicted.step_time_s
    assert "so compression pays" in exp.compression and f"({rival / best:.2f}x)" in exp.compression
    assert explain(found[SITE, True], graph=graph, profile=two_site, sensitivity=False).compression == ""


def test_across_the_wan_diloco_beats_every_synchronous_plan_by_far(searched, two_site):
    """Unpinned under --allow-lossy, the 64-GPU search across both sites syncs its replicas every 500 steps
    (DiLoCo): its amortised outer all-reduce is a small part of the step, where the best synchronous plan,
    compressed or not, waits on the wide-area link every step."""
    graph, found = searched
    lossy = plan_graph(graph, devices=2 * SITE, profile=two_site, batch_size=512, fix={"tp": 1, "pp": 1},
                       allow_lossy=True)  # fmt: skip
    assert (lossy.best.sync_every, lossy.best.outer_optimizer) == (500, "nesterov")
    synchronous = found[2 * SITE, True].best.predicted.step_time_s
    assert lossy.best.predicted.step_time_s < synchronous / 10
