"""Where the ranks of each mesh axis sit: inside one node, across nodes, or across sites (types/sites.py).

Ranks form a ``(pp, dp, cp, tp)`` mesh with tp innermost, as autoplan/types/layout.py states it for
the cost model and the executor alike; ``node(rank) = rank // devices_per_node``. The cp group has
stride tp, and "dp_cp" is the dp x cp group that holds the same weights (the dp group when cp = 1).
:func:`mesh_groups` reports, per axis, the group size and how many of
the group's ranks share a node. When a group spans nodes, ``ranks_per_node`` is the fewest
ranks any of its nodes holds (that node's share of the NICs is the bottleneck; see
autoplan/cost/network/comm.py). When groups of one axis differ (a tp that does not divide the node),
the worst group decides, because the collective waits for its slowest group.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from autoplan.errors import PlanError
from autoplan.types.hash_once import hash_once
from autoplan.types.hsdp import HSDP_AXES
from autoplan.types.layout import MESH_AXES, mesh_shape
from autoplan.types.profile import Profile
from autoplan.types.sites import devices_per_site


@hash_once
@dataclass(frozen=True)
class AxisGroup:
    """One process group along a mesh axis, as the cost model sees it."""

    size: int  # ranks in one group along this axis
    ranks_per_node: int  # how many of those ranks share one node (== size when the group stays in a node)
    sites: int = 1  # sites the group's ranks sit on (types/sites.py; 1 without sites)
    ranks_per_site: int = 0  # the fewest of its ranks one of those sites holds (0: the group stays in a site)

    @property
    def spans_sites(self) -> bool:
        return self.sites > 1

    @property
    def spans_nodes(self) -> bool:
        return self.ranks_per_node < self.size

    @property
    def nodes(self) -> int:
        """Nodes the group touches (rounded up when groups are irregular)."""
        return -(-self.size // self.ranks_per_node)


def mesh_groups(
    profile: Profile, *, dp: int, tp: int, pp: int, cp: int = 1, dp_replicate: int = 1
) -> dict[str, AxisGroup]:
    """The tp, dp and pp groups of a ``(pp, dp, cp, tp)`` mesh on ``profile``'s nodes, and with
    cp > 1 its cp and dp x cp ("dp_cp") groups; with cp = 1 "dp_cp" is the dp group. "dp_shard" and
    "dp_replicate" are HSDP's split of the weight-sharing group (types/hsdp.py): with dp_replicate = 1
    the shard group is "dp_cp" and the replicate group one rank."""
    for name, value in (("dp", dp), ("tp", tp), ("pp", pp), ("cp", cp), ("dp_replicate", dp_replicate)):
        if not isinstance(value, int) or value < 1:
            raise PlanError(f"mesh degree {name}={value!r}; expected an integer >= 1.")
    groups = dict(_mesh_groups(profile.devices_per_node, dp, tp, pp, cp, devices_per_site(profile)))
    if cp == 1:
        groups["dp_cp"] = groups["dp"]
        groups["cp"] = AxisGroup(size=1, ranks_per_node=1)
    groups["dp_shard"], groups["dp_replicate"] = groups["dp_cp"], AxisGroup(size=1, ranks_per_node=1)
    if dp_replicate > 1:
        groups.update(_hsdp_groups(profile.devices_per_node, dp, tp, pp, dp_replicate, cp, devices_per_site(profile)))
    return groups


def plan_mesh_groups(profile: Profile, plan) -> dict[str, AxisGroup]:
    """:func:`mesh_groups` of ``plan``'s degrees."""
    return mesh_groups(profile, dp=plan.dp, tp=plan.tp, pp=plan.pp, cp=plan.cp, dp_replicate=plan.dp_replicate)


@lru_cache(maxsize=1024)
def _hsdp_groups(
    devices_per_node: int, dp: int, tp: int, pp: int, replicate: int, cp: int, per_site: int
) -> tuple[tuple[str, AxisGroup], ...]:
    """HSDP's shard and replicate groups (types/hsdp.py ``hsdp_groups``: the row-major ``(pp, dp_replicate,
    dp_shard x cp, tp)`` mesh) counted from the axis sizes alone (:func:`mesh_axis_group`)."""
    shape = dict(pp=pp, **{HSDP_AXES[0]: replicate, HSDP_AXES[1]: dp // replicate * cp}, tp=tp)
    return tuple((axis, mesh_axis_group(shape, axis, devices_per_node, per_site)) for axis in HSDP_AXES)


@lru_cache(maxsize=4096)
def _mesh_groups(
    devices_per_node: int, dp: int, tp: int, pp: int, cp: int, per_site: int
) -> tuple[tuple[str, AxisGroup], ...]:
    shape = dict(zip(MESH_AXES, mesh_shape(pp=pp, dp=dp, cp=cp, tp=tp)))
    axes = ("tp", "dp", "pp") if cp == 1 else ("tp", "dp", "pp", "cp", "dp_cp")
    flat = dict(pp=pp, dp_cp=dp * cp, tp=tp)  # the ranks holding the same weights (types/layout.py plan_groups)
    return tuple(
        (axis, mesh_axis_group(flat if axis == "dp_cp" else shape, axis, devices_per_node, per_site)) for axis in axes
    )


def mesh_axis_group(shape: dict[str, int], axis: str, devices_per_node: int, per_site: int = 0) -> AxisGroup:
    """``_worst`` of every group along ``axis`` of the row-major mesh ``shape`` ({name: size}, outermost first),
    from the sizes alone (:func:`_axis_group`): no rank list is built."""
    sizes = list(shape.values())
    at = list(shape).index(axis)
    outer, stride = math.prod(sizes[:at]), math.prod(sizes[at + 1 :])
    return _axis_group(sizes[at], stride, outer, devices_per_node, per_site)


@lru_cache(maxsize=4096)
def _axis_group(size: int, stride: int, outer: int, devices_per_node: int, per_site: int) -> AxisGroup:
    """The groups along an axis of ``size`` ranks ``stride`` apart, one per base ``o * size * stride + j``
    (``o < outer``, ``j < stride``): a group's ranks sit on nodes as its base modulo the node does
    (:func:`_distinct_patterns`), so only the residues of the bases are counted (:func:`_residues`)."""
    fewest = size
    for counts in _patterns(size, stride, outer, devices_per_node):
        if len(counts) > 1:
            fewest = min(fewest, min(counts))
    if not per_site:
        return AxisGroup(size=size, ranks_per_node=fewest)
    spread = _patterns(size, stride, outer, per_site)
    sites = max(len(counts) for counts in spread)
    on_site = min((min(c) for c in spread if len(c) > 1), default=0)
    return AxisGroup(size=size, ranks_per_node=fewest, sites=sites, ranks_per_site=on_site)


def _patterns(size: int, stride: int, outer: int, block: int) -> list[list[int]]:
    """For each distinct residue r of a group's base modulo ``block`` devices, how many of the ranks
    r, r + stride, ..., r + (size - 1) stride each block holds (:func:`_per`'s values)."""
    return [
        list(_per([r + stride * i for i in range(size)], block).values()) for r in _residues(size, stride, outer, block)
    ]


def _residues(size: int, stride: int, outer: int, block: int) -> list[int]:
    """The bases ``o * size * stride + j`` modulo ``block``: every residue once ``stride`` reaches it, else those
    of the first ``block / gcd(size * stride, block)`` values of o (after them o's term repeats modulo ``block``)."""
    if stride >= block:
        return list(range(block))
    period = block // math.gcd(size * stride, block)
    return sorted({(o * size * stride + j) % block for o in range(min(outer, period)) for j in range(stride)})


def ep_groups(profile: Profile, *, dp: int, ep: int, pp: int, tp: int = 1, expert_tp: int = 1) -> dict[str, AxisGroup]:
    """The experts' groups (types/layout.py ``expert_groups``): "ep", the ranks that split the experts and
    exchange tokens; "edp", those that hold the same expert shards and reduce their gradients; "etp", those
    that split each local expert's FFN (autoplan/types/expert_layout.py). At tp = expert_tp = 1 the ep group
    is ``ep`` consecutive dp ranks and the edp group the ``dp / ep`` ranks of stride ``ep``."""
    if ep < 1 or expert_tp < 1 or (dp * tp) % (ep * expert_tp):
        raise PlanError(f"mesh degrees ep={ep} x expert_tp={expert_tp} must divide dp*tp={dp * tp}.")
    return dict(_ep_groups(profile.devices_per_node, dp, ep, pp, tp, expert_tp, devices_per_site(profile)))


@lru_cache(maxsize=1024)
def _ep_groups(
    devices_per_node: int, dp: int, ep: int, pp: int, tp: int, expert_tp: int, per_site: int
) -> tuple[tuple[str, AxisGroup], ...]:
    shape = dict(pp=pp, edp=dp * tp // (ep * expert_tp), ep=ep, etp=expert_tp)  # types/layout.py expert_groups
    return tuple((axis, mesh_axis_group(shape, axis, devices_per_node, per_site)) for axis in ("ep", "edp", "etp"))


def _worst(groups: list[list[int]], devices_per_node: int, per_site: int = 0) -> AxisGroup:
    """The group with the smallest per-node share: a spanning group beats one that stays; with sites of
    ``per_site`` devices (0: none), the most sites any group spans and the fewest ranks a site holds."""
    size = len(groups[0])
    fewest = size
    for ranks in _distinct_patterns(groups, devices_per_node):
        counts = _per(ranks, devices_per_node)
        if len(counts) > 1:
            fewest = min(fewest, min(counts.values()))
    if not per_site:
        return AxisGroup(size=size, ranks_per_node=fewest)
    spread = [_per(ranks, per_site) for ranks in _distinct_patterns(groups, per_site)]
    sites = max(len(counts) for counts in spread)
    on_site = min((min(c.values()) for c in spread if len(c) > 1), default=0)
    return AxisGroup(size=size, ranks_per_node=fewest, sites=sites, ranks_per_site=on_site)


def _per(ranks: list[int], devices: int) -> dict[int, int]:
    """How many of ``ranks`` each block of ``devices`` consecutive ranks (a node, a site) holds."""
    counts: dict[int, int] = {}
    for rank in ranks:
        counts[rank // devices] = counts.get(rank // devices, 0) + 1
    return counts


def _distinct_patterns(groups: list[list[int]], devices_per_node: int) -> list[list[int]]:
    """Groups up to a shift by whole nodes: those shifted by a multiple of the node size
    sit on nodes the same way, so only one of each needs counting."""
    seen: set[tuple[int, ...]] = set()
    unique = []
    for ranks in groups:
        shift = (ranks[0] // devices_per_node) * devices_per_node
        key = tuple(rank - shift for rank in ranks)
        if key not in seen:
            seen.add(key)
            unique.append(ranks)
    return unique
