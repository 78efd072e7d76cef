"""Top-k gradient sparsification with error feedback, priced as autoplan's DDP hook runs it
(autoplan/execute/topk_hook.py; Lin, Han, Mao, Wang & Dally, ICLR 2018, "Deep Gradient Compression").

Per DDP bucket of fp32 gradients on each of p ranks, r = ``topk_ratio``, n_t a tensor's entries:

    k_bucket       = sum_t ceil(r n_t)             (so k is the same on every rank, and exact at r = 1)
    fed            = g + e;  send the k largest |fed| as (int32 index, fp32 value);  e = fed, sent entries 0
    gathered_bytes = p * K * (4 + 4)               K = sum over every gradient tensor of ceil(r n_t)
    collectives    = 1 all-gather per bucket, each rank's k pairs (the message: all p ranks' pairs)
    compute        = SELECTION_PASSES * 4 * E / memory bandwidth     (E: every gradient entry)
    held_bytes     = 4 * E                         (the residual e, fp32, one per gradient entry)
    hook_bytes     = min(bucket, 4 E) + 8 p k      (|fed| for the selection, the gathered pairs)

The selection's passes over the bucket: fed = e += g (read e, read g, write: 3), |fed| (read, write: 2),
top-k's scan of it (1: radix select reads it at least once; the floor of torch.topk), the dense sum's zero
fill (1) and its division by p (read, write: 2): 9. The sum of the p k gathered pairs is a scatter-add,
k-sized, left out. DGC's momentum correction and clipping are not run (plain SGD-style error feedback).
docs/cost-model.md, "Top-k sparsification" has the derivation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from autoplan.cost.compute.roofline import memory_time_s
from autoplan.cost.memory.per_device import DDP_BUCKET_BYTES
from autoplan.cost.network.comm import collective_time_s
from autoplan.cost.network.mesh import AxisGroup
from autoplan.types.graph import Graph
from autoplan.types.profile import Profile

GRAD_BYTES = 4  # the hook selects from the fp32 gradients (plan: grad_reduce_dtype fp32)
INDEX_BYTES = 4  # an int32 index into the bucket
PAIR_BYTES = INDEX_BYTES + GRAD_BYTES
SELECTION_PASSES = 9  # module docstring


@dataclass(frozen=True)
class TopKTraffic:
    """What top-k sends, computes and holds for a set of gradients on one of ``ranks`` ranks."""

    elements: float = 0.0  # every gradient entry E
    selected: float = 0.0  # K: the pairs one rank sends
    ranks: int = 1

    @property
    def sent_bytes(self) -> float:
        """The all-gathered message: every rank's K pairs (cost/network/comm.py's all-gather convention)."""
        return self.ranks * PAIR_BYTES * self.selected

    @property
    def held_bytes(self) -> float:
        """The residual (error feedback), fp32 for every gradient entry."""
        return GRAD_BYTES * self.elements

    @property
    def hook_bytes(self) -> float:
        """What the hook allocates for its bucket: |fed| and the gathered pairs, each at most one bucket's."""
        bucket = min(DDP_BUCKET_BYTES, GRAD_BYTES * self.elements)
        share = bucket / (GRAD_BYTES * self.elements) if self.elements else 0.0
        return bucket + self.ranks * PAIR_BYTES * self.selected * share


def selected_of(numel: int, ratio: float) -> int:
    """One tensor's share of its bucket's k: ceil(r n)."""
    return min(numel, math.ceil(ratio * numel))


def traffic_of(numels: list[int], ratio: float, ranks: int) -> TopKTraffic:
    """Top-k's traffic for gradients of these sizes (module docstring)."""
    return TopKTraffic(
        elements=float(sum(numels)), selected=float(sum(selected_of(n, ratio) for n in numels)), ranks=ranks
    )


def blocks_traffic(graph: Graph, names: list[tuple[str, ...]], ratio: float, ranks: int) -> list[TopKTraffic]:
    """Per block, the traffic of its distinct trainable parameters (``names``: compression.distinct_names)."""
    params = graph.parameters
    return [
        traffic_of([params[n].numel for n in block if n in params and params[n].trainable], ratio, ranks)
        for block in names
    ]


def total(traffics: list[TopKTraffic], ranks: int) -> TopKTraffic:
    return TopKTraffic(
        elements=sum(t.elements for t in traffics), selected=sum(t.selected for t in traffics), ranks=ranks
    )


def compute_s(profile: Profile, traffic: TopKTraffic) -> float:
    """Seconds of the hook's own work on one rank: SELECTION_PASSES memory-bound passes over the fp32 bucket."""
    return memory_time_s(profile, SELECTION_PASSES * GRAD_BYTES * traffic.elements)


def sync_s(profile: Profile, traffic: TopKTraffic, *, group: AxisGroup, bucket_bytes: float) -> float:
    """One all-gather of (index, value) pairs per DDP bucket, each bucket's share of the K pairs."""
    if group.size <= 1 or traffic.elements <= 0:
        return 0.0
    buckets = max(1, math.ceil(GRAD_BYTES * traffic.elements / bucket_bytes))
    return buckets * collective_time_s(profile, "all_gather", traffic.sent_bytes / buckets, group=group)
