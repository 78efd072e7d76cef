"""Time of one collective on a process group, from the profile's alpha-beta fits.

Inside one node (Thakur, Rabenseifner & Gropp 2005; nccl-tests PERFORMANCE.md busbw):

    t(n, S) = alpha_intra + c(kind, n) * S / busbw_intra
    c = 2(n-1)/n (all_reduce), (n-1)/n (all_gather, reduce_scatter, all_to_all), 1 (send_recv)

S is the full message in bytes (for all_gather the gathered output, for reduce_scatter the
input). ``alpha_s`` is the whole collective's start-up latency, exactly as the profile
fitter defines it (autoplan/profile/fit.py fits t = alpha_s + c(n) * S / busbw).

Across nodes (group of n ranks, k per node, N = ceil(n/k) nodes, d devices per node):
NCCL runs a node-aware ring (trees for all_reduce at scale) whose chunks stream through the
intra-node hops and the inter-node NIC hops at the same time, so the slowest level bounds
the bandwidth term, and each level adds its own latency:

    bandwidth: max( c(kind, k) * S / busbw_intra,  c(kind, n) * S / (busbw_inter * k / d) )
    latency:   alpha_intra + alpha_inter * max(1, ceil(log2 N))

(the inter-node start-up grows with the depth of NCCL's trees across N nodes; alpha_inter
is fitted on 2-node groups, where the depth is 1).

``busbw_inter`` is the full-node figure (nccl-tests with all d GPUs of every node in the
group, one NIC rail per GPU, docs/profile-format.md); a group holding k ranks of a node
drives k of its d rails, hence the k/d scaling. This reproduces nccl-tests' multi-node
busbw (about the per-node NIC bandwidth for a DGX A100). A sequential 2-D decomposition
(intra reduce-scatter, inter all-reduce of S/k, intra all-gather) would add the NVLink time
on top and over-predict multi-node all-reduce by ~70% on a DGX A100, so it is not used.
"""
from __future__ import annotations

import math

from autoplan.cost.mesh import AxisGroup
from autoplan.errors import AutoplanError
from autoplan.types.profile import COLLECTIVES, CollectiveFit, Profile


def bus_factor(kind: str, n: int) -> float:
    """nccl-tests' bus-bandwidth factor c(kind, n): bytes on the busiest link per message byte."""
    if kind == "send_recv":
        return 1.0
    if n <= 1:
        return 0.0
    if kind == "all_reduce":
        return 2.0 * (n - 1) / n
    return (n - 1) / n


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
        return _send_recv_s(profile, message_bytes, group=group)
    if not group.spans_nodes:
        return _flat_s(profile.intra_node.collectives[kind], kind, group.size, message_bytes)
    return _spanning_s(profile, kind, message_bytes, group=group)


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
    k, n, nodes = group.ranks_per_node, group.size, group.nodes
    intra_bw_s = bus_factor(kind, k) * message_bytes / intra.busbw_bytes_per_s
    inter_bw_s = bus_factor(kind, n) * message_bytes / (inter.busbw_bytes_per_s * _nic_share(profile, group))
    latency_s = (intra.alpha_s if k > 1 else 0.0) + inter.alpha_s * max(1, math.ceil(math.log2(nodes)))
    return latency_s + max(intra_bw_s, inter_bw_s)


def _nic_share(profile: Profile, group: AxisGroup) -> float:
    """Fraction of a node's inter-node bandwidth one group gets: its ranks_per_node rails of d."""
    return min(1.0, group.ranks_per_node / profile.devices_per_node)
