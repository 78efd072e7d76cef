"""Time of one collective on a process group, from the profile's alpha-beta fits (docs/cost-model.md,
"Collectives").

Inside one node (Thakur, Rabenseifner & Gropp 2005; nccl-tests PERFORMANCE.md busbw), S the full
message in bytes and c :func:`autoplan.types.profile.bus_factor`:

    t(n, S) = alpha_intra + c(kind, n) * S / busbw_intra

Across nodes (n ranks, k per node, N = ceil(n/k) nodes, d devices per node), NCCL's node-aware
ring or tree streams through both levels at once, so the slower bounds the bandwidth term:

    bandwidth: max( c(kind, k) * S / busbw_intra,  c(kind, n) * S / (busbw_inter * k / d) )
    latency:   alpha_intra + alpha_inter * max(1, ceil(log2 N))                 (tree)
               max(tree, alpha_intra / (d - 1) * (n - N) + alpha_inter * (N - 1))  (ring: all_gather,
                                                                                reduce_scatter, k > 1)

Across sites (types/sites.py: s sites, the fewest ranks on one k_s of its D_s devices), the wide-area
link bounds the bandwidth as well and adds its latency, per tree level or per ring hop between sites:

    bandwidth: max( ..., c(kind, n) * S / (busbw_site * k_s / D_s) );   latency += alpha_site * (ceil(log2 s) | s - 1)

The ring's latency is NCCL's (NVIDIA/nccl src/graph/tuning.cc: ``baseLat + (nsteps - nInterSteps)
* intraLat + nInterSteps * interLat``, ``nsteps = n - 1``, ``nInterSteps = N - 1``).
"""

from __future__ import annotations

import math

from autoplan.cost.network.mesh import AxisGroup
from autoplan.errors import AutoplanError
from autoplan.types.profile import COLLECTIVES, CollectiveFit, Profile, bus_factor
from autoplan.types.sites import devices_per_site


def collective_time_s(profile: Profile, kind: str, message_bytes: float, *, group: AxisGroup) -> float:
    """Seconds for one ``kind`` collective of ``message_bytes`` on ``group`` (see module doc).

    Zero for a group of one rank; send_recv is point to point and priced for any group size
    (the caller decides whether a send happens), on the inter-node link when the group spans nodes.
    """
    if kind not in COLLECTIVES:
        raise AutoplanError(f"collective kind '{kind}' is unknown; expected one of {', '.join(COLLECTIVES)}.")
    if message_bytes <= 0 or (group.size <= 1 and kind != "send_recv"):
        return 0.0
    if kind == "send_recv":
        return _send_recv_s(profile, message_bytes, group=group) + _site_excess_s(profile, kind, message_bytes, group)
    if not group.spans_nodes:
        return _flat_s(profile.intra_node.collectives[kind], kind, group.size, message_bytes)
    return _spanning_s(profile, kind, message_bytes, group=group) + _site_excess_s(profile, kind, message_bytes, group)


def bucketed_time_s(
    profile: Profile, kind: str, message_bytes: float, *, group: AxisGroup, bucket_bytes: float | None
) -> float:
    """``message_bytes`` sent as ceil(S / bucket_bytes) equal collectives, each paying its latency
    (DDP's gradient buckets), or as one collective when ``bucket_bytes`` is None (an FSDP unit's
    flat all-gather or reduce-scatter, ZeRO-1's flat buffer: NCCL pipelines one large call
    internally and pays its start-up once, tuning.cc's ``lat * numPipeOps``)."""
    if message_bytes <= 0 or group.size <= 1:
        return 0.0
    buckets = max(1, math.ceil(message_bytes / bucket_bytes)) if bucket_bytes else 1
    return buckets * collective_time_s(profile, kind, message_bytes / buckets, group=group)


class BucketedTimes:
    """:func:`bucketed_time_s` on one profile, memoised on (kind, bytes, group, bucket bytes): identical
    blocks and parameter counts send identical messages, thousands of times a search."""

    def __init__(self, profile: Profile):
        self.profile = profile
        self._memo: dict[tuple, float] = {}

    def __call__(self, kind: str, message_bytes: float, group: AxisGroup, bucket_bytes: float | None) -> float:
        key = (kind, message_bytes, group, bucket_bytes)
        hit = self._memo.get(key)
        if hit is None:
            hit = self._memo[key] = bucketed_time_s(
                self.profile, kind, message_bytes, group=group, bucket_bytes=bucket_bytes
            )
        return hit


def _flat_s(fit: CollectiveFit, kind: str, n: int, message_bytes: float) -> float:
    return fit.alpha_s + bus_factor(kind, n) * message_bytes / fit.busbw_bytes_per_s


def _send_recv_s(profile: Profile, message_bytes: float, *, group: AxisGroup) -> float:
    if not group.spans_nodes:
        return _flat_s(profile.intra_node.collectives["send_recv"], "send_recv", 2, message_bytes)
    fit = profile.link(True).collectives["send_recv"]
    share = _nic_share(profile, group)
    return fit.alpha_s + message_bytes / (fit.busbw_bytes_per_s * share)


def _spanning_s(profile: Profile, kind: str, message_bytes: float, *, group: AxisGroup) -> float:
    intra = profile.intra_node.collectives[kind]
    inter = profile.link(True).collectives[kind]
    k, n = group.ranks_per_node, group.size
    intra_bw_s = bus_factor(kind, k) * message_bytes / intra.busbw_bytes_per_s
    inter_bw_s = bus_factor(kind, n) * message_bytes / (inter.busbw_bytes_per_s * _nic_share(profile, group))
    return _spanning_latency_s(profile, kind, group) + max(intra_bw_s, inter_bw_s)


RING_ONLY = ("all_gather", "reduce_scatter")  # NCCL runs no tree for these (module docstring)


def _spanning_latency_s(profile: Profile, kind: str, group: AxisGroup) -> float:
    """Start-up of a collective across nodes: tree depth, or a ring's n - 1 hops (module docstring)."""
    intra, inter = profile.intra_node.collectives[kind], profile.link(True).collectives[kind]
    k, n, nodes = group.ranks_per_node, group.size, group.nodes
    tree_s = (intra.alpha_s if k > 1 else 0.0) + inter.alpha_s * max(1, math.ceil(math.log2(nodes)))
    if kind not in RING_ONLY or k <= 1:
        return tree_s
    hop_intra_s = intra.alpha_s / max(1, profile.devices_per_node - 1)
    return max(tree_s, hop_intra_s * (n - nodes) + inter.alpha_s * (nodes - 1))


def _nic_share(profile: Profile, group: AxisGroup) -> float:
    """Fraction of a node's inter-node bandwidth one group gets: its ranks_per_node rails of d."""
    return min(1.0, group.ranks_per_node / profile.devices_per_node)


def _site_excess_s(profile: Profile, kind: str, message_bytes: float, group: AxisGroup) -> float:
    """What crossing sites adds to a spanning collective (module docstring): the wide-area link's latency
    (per tree level, or per ring hop between sites) and the part of its bandwidth term beyond the node
    levels'. 0 for a group within one site."""
    if not group.spans_sites:
        return 0.0
    wan = profile.sites.link.collectives[kind]
    levels = group.sites - 1 if kind in RING_ONLY else max(1, math.ceil(math.log2(group.sites)))
    share = min(1.0, group.ranks_per_site / devices_per_site(profile))
    wan_bw_s = bus_factor(kind, group.size) * message_bytes / (wan.busbw_bytes_per_s * share)
    inter, intra = profile.link(True).collectives[kind], profile.intra_node.collectives[kind]
    node_bw_s = bus_factor(kind, group.size) * message_bytes / (inter.busbw_bytes_per_s * _nic_share(profile, group))
    if kind != "send_recv":  # _spanning_s streams through both node levels: the slower bounds it
        node_bw_s = max(node_bw_s, bus_factor(kind, group.ranks_per_node) * message_bytes / intra.busbw_bytes_per_s)
    return wan.alpha_s * (1 if kind == "send_recv" else levels) + max(0.0, wan_bw_s - node_bw_s)
