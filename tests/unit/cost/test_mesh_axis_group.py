"""cost/network/mesh.py counts where a mesh axis's groups sit from the axis sizes alone (no rank lists): each
answer must equal the explicit one, every group of types/layout.py's rank lists held against the nodes and sites
(mesh._worst), on meshes whose degrees do and do not divide the node and the site."""

from __future__ import annotations

import itertools
from types import SimpleNamespace

from autoplan.cost.network import mesh
from autoplan.types import hsdp
from autoplan.types.hsdp import HSDP_AXES, hsdp_groups
from autoplan.types.layout import expert_groups, plan_groups
from autoplan.types.sites import devices_per_site

DEGREES = [1, 2, 3, 4, 6, 8]


def _profile(per_node: int, nodes_per_site: int | None) -> SimpleNamespace:
    sites = SimpleNamespace(nodes_per_site=nodes_per_site) if nodes_per_site else None
    return SimpleNamespace(devices_per_node=per_node, sites=sites)


def test_mesh_groups_equal_the_explicit_groups_worst():
    checked = 0
    for dp, tp, pp, cp in itertools.product(DEGREES, [1, 2, 3, 4], [1, 2, 3], [1, 2, 3]):
        explicit = plan_groups(pp=pp, dp=dp, tp=tp, cp=cp)
        for per_node, nodes_per_site in [(1, None), (4, None), (6, 2), (8, 3), (16, None)]:
            profile = _profile(per_node, nodes_per_site)
            got = mesh.mesh_groups(profile, dp=dp, tp=tp, pp=pp, cp=cp)
            for axis in ("tp", "dp", "pp", "cp", "dp_cp") if cp > 1 else ("tp", "dp", "pp"):
                assert got[axis] == mesh._worst(explicit[axis], per_node, devices_per_site(profile)), (dp, tp, pp, cp)
                checked += 1
    assert checked > 1000


def test_ep_groups_equal_the_explicit_groups_worst():
    for dp, tp, pp, ep, etp in itertools.product(DEGREES, [1, 2, 4], [1, 2], [1, 2, 4], [1, 2]):
        if (dp * tp) % (ep * etp):
            continue
        explicit = expert_groups(pp=pp, dp=dp, ep=ep, tp=tp, expert_tp=etp)
        for per_node, nodes_per_site in [(4, None), (6, 2), (8, None)]:
            profile = _profile(per_node, nodes_per_site)
            got = mesh.ep_groups(profile, dp=dp, ep=ep, pp=pp, tp=tp, expert_tp=etp)
            for axis in ("ep", "edp", "etp"):
                assert got[axis] == mesh._worst(explicit[axis], per_node, devices_per_site(profile)), (dp, tp, ep, etp)


def test_hsdp_groups_equal_the_explicit_groups_worst():
    checked = 0
    for dp, tp, pp, cp, replicate in itertools.product([2, 4, 6, 8, 12], [1, 2, 3, 4], [1, 2], [1, 2, 3], [2, 3, 4]):
        if dp % replicate:
            continue
        explicit = hsdp_groups(pp=pp, dp=dp, tp=tp, dp_replicate=replicate, cp=cp)
        for per_node, nodes_per_site in [(1, None), (4, None), (6, 2), (8, 3), (16, None)]:
            profile = _profile(per_node, nodes_per_site)
            got = mesh.mesh_groups(profile, dp=dp, tp=tp, pp=pp, cp=cp, dp_replicate=replicate)
            for axis in HSDP_AXES:
                expected = mesh._worst(explicit[axis], per_node, devices_per_site(profile))
                assert got[axis] == expected, (dp, tp, pp, cp, replicate, axis)
                checked += 1
    assert checked > 500


def test_hsdp_groups_build_no_rank_list(monkeypatch):
    """A search meets HSDP meshes of a thousand ranks or more: their groups are counted from the sizes alone."""

    def built(*args, **kwargs):
        raise AssertionError("HSDP's rank lists were built")

    monkeypatch.setattr(hsdp, "axis_groups", built)
    mesh._hsdp_groups.cache_clear()
    got = mesh.mesh_groups(_profile(8, None), dp=256, tp=2, pp=2, cp=1, dp_replicate=4)
    assert (got["dp_shard"].size, got["dp_replicate"].size) == (64, 4)
    assert got["dp_shard"].spans_nodes and got["dp_replicate"].ranks_per_node == 1


def test_a_group_across_nodes_is_counted_by_its_fewest_share():
    """tp = 3 on nodes of 4: the groups [0, 1, 2], [3, 4, 5], ... straddle nodes with one rank on one side."""
    group = mesh.mesh_groups(_profile(4, None), dp=4, tp=3, pp=1)["tp"]
    assert (group.size, group.ranks_per_node, group.spans_nodes) == (3, 1, True)
