"""PowerSGD gradient compression, priced as torch's DDP ``powerSGD_hook`` runs it.

PowerSGD (Vogels, Karimireddy & Jaggi, NeurIPS 2019, Algorithm 1; torch's
ddp_comm_hooks/powerSGD_hook.py) per DDP bucket, each gradient viewed as M (n x m), r' = min(n, m, r):

    compressed  iff  (n + m) r' * min_compression_rate < n m      (min_compression_rate = 2)
    sent_bytes     = b * (sum_uncompressed n m  +  sum_compressed (n + m) r')    (b = 4, fp32)
    collectives    = 3 per DDP bucket (uncompressed tensors, every P, every Q)
    matmul_flops   = sum_compressed 3 * 2 n m r'
    matmul_bytes   = sum_compressed 3 * b n m
    orth_flops     = sum_compressed 2 (n + m) r'^2
    feedback_bytes = 4 passes * 2 * b * sum_all n m
    held_bytes     = b * (sum_all n m  +  sum_compressed (n + m) r')

The hook's two bucket copies are priced with the last bucket, after the backward; its compute adds
to the step (``compression_s``). docs/cost-model.md, "Lossy gradient sync" has the derivation.
"""

from __future__ import annotations

import math
from dataclasses import astuple, dataclass

from autoplan.cost.compute.roofline import memory_time_s
from autoplan.cost.memory.per_device import DDP_BUCKET_BYTES
from autoplan.cost.network.comm import collective_time_s
from autoplan.cost.network.mesh import AxisGroup
from autoplan.errors import PlanError
from autoplan.types.graph import Graph
from autoplan.types.profile import Profile

MIN_COMPRESSION_RATE = 2  # torch's PowerSGDState default, which autoplan keeps
GRAD_BYTES = 4  # the hook compresses the fp32 gradients (plan: grad_reduce_dtype fp32)
FEEDBACK_PASSES = 4  # add E, clone, subtract, store: each reads and writes the bucket


@dataclass(frozen=True)
class PowerSGDTraffic:
    """What PowerSGD sends, computes and holds for a set of gradients (module docstring)."""

    elements: float = 0.0  # every gradient element (the uncompressed message)
    uncompressed_elements: float = 0.0
    p_elements: float = 0.0  # P: sum n r' over compressed matrices
    q_elements: float = 0.0  # Q: sum m r'
    matmul_flops: float = 0.0
    matmul_elements: float = 0.0  # sum n m over compressed matrices (each thin matmul streams M)
    orth_flops: float = 0.0

    @property
    def factor_elements(self) -> float:
        return self.p_elements + self.q_elements

    @property
    def sent_elements(self) -> float:
        return self.uncompressed_elements + self.factor_elements

    @property
    def sent_bytes(self) -> float:
        return GRAD_BYTES * self.sent_elements

    @property
    def held_bytes(self) -> float:
        """Error feedback for every gradient plus the warm-start factors."""
        return GRAD_BYTES * (self.elements + self.factor_elements)

    @property
    def hook_bytes(self) -> float:
        """What the hook allocates for the bucket it compresses, after its gradients are ready: its
        copy and the new error made before the old is dropped, each at most one DDP bucket."""
        return 2 * min(DDP_BUCKET_BYTES, GRAD_BYTES * self.elements)

    def __add__(self, other: "PowerSGDTraffic") -> "PowerSGDTraffic":
        return PowerSGDTraffic(*(a + b for a, b in zip(astuple(self), astuple(other))))


def matrix_of(shape: list[int]) -> tuple[int, int]:
    """How the hook views a gradient: (shape[0], the rest)."""
    n = shape[0] if shape else 1
    numel = math.prod(shape) if shape else 1
    return n, numel // max(n, 1)


def compresses(n: int, m: int, rank: int) -> bool:
    """torch's ``_should_compress`` at the default min_compression_rate."""
    r = min(n, m, rank)
    return (n + m) * r * MIN_COMPRESSION_RATE < n * m


def traffic_of(shapes: list[list[int]], rank: int) -> PowerSGDTraffic:
    """PowerSGD's traffic for gradients of these shapes (module docstring)."""
    total = PowerSGDTraffic()
    for shape in shapes:
        n, m = matrix_of(shape)
        if not compresses(n, m, rank):
            total = total + PowerSGDTraffic(elements=n * m, uncompressed_elements=n * m)
            continue
        r = min(n, m, rank)
        total = total + PowerSGDTraffic(
            elements=n * m,
            p_elements=n * r,
            q_elements=m * r,
            matmul_flops=3 * 2.0 * n * m * r,
            matmul_elements=n * m,
            orth_flops=2.0 * (n + m) * r * r,
        )
    return total


def block_traffic(graph: Graph, param_names: tuple[str, ...], rank: int) -> PowerSGDTraffic:
    """The traffic of one block's parameters (their traced shapes: PowerSGD runs with tp = 1)."""
    return traffic_of([graph.parameters[name].shape for name in param_names if name in graph.parameters], rank)


def blocks_traffic(graph: Graph, blocks: list, rank: int) -> list[PowerSGDTraffic]:
    """Per block (in order), the traffic of its parameters. Identical blocks are priced from one
    representative, so equal ``param_names`` stand for different layers and all count; a name
    already met in another block's names is a tied weight (an embedding reused by the head), one
    DDP gradient, sent once."""
    return [block_traffic(graph, names, rank) for names in distinct_names(blocks)]


def distinct_names(blocks: list) -> list[tuple[str, ...]]:
    """Per block, its parameter names less those another block already named (a tied weight, one DDP
    gradient); equal ``param_names`` (identical blocks priced from one representative) all count."""
    seen: dict[str, tuple[str, ...]] = {}
    found = []
    for block in blocks:
        unique = dict.fromkeys(block.param_names)
        found.append(tuple(n for n in unique if seen.setdefault(n, block.param_names) == block.param_names))
    return found


def total(traffics: list[PowerSGDTraffic]) -> PowerSGDTraffic:
    return sum(traffics, PowerSGDTraffic())


def compute_s(profile: Profile, traffic: PowerSGDTraffic) -> float:
    """Seconds of the hook's own work on one rank: thin matmuls and orthogonalisation at the
    device's vector rate or its memory bandwidth, whichever is slower, plus the error-feedback passes."""
    device = profile.device
    vector_peak = device.peak_flops.get("fp32") or min(device.peak_flops.values())
    flops_s = (traffic.matmul_flops + traffic.orth_flops) / (vector_peak * device.efficiency["matmul"].max_efficiency)
    streamed_s = memory_time_s(profile, 3 * GRAD_BYTES * traffic.matmul_elements)
    feedback_s = memory_time_s(profile, FEEDBACK_PASSES * 2 * GRAD_BYTES * traffic.elements)
    return max(flops_s, streamed_s) + feedback_s


def sync_s(profile: Profile, traffic: PowerSGDTraffic, *, group: AxisGroup, bucket_bytes: float) -> float:
    """The three all-reduces per DDP bucket (uncompressed tensors, P, Q), each bucket's share."""
    if group.size <= 1 or traffic.elements <= 0:
        return 0.0
    buckets = max(1, math.ceil(GRAD_BYTES * traffic.elements / bucket_bytes))
    parts = (traffic.uncompressed_elements, traffic.p_elements, traffic.q_elements)
    return buckets * sum(
        collective_time_s(profile, "all_reduce", GRAD_BYTES * part / buckets, group=group) for part in parts if part
    )


def compresses_any(graph: Graph, rank: int) -> bool:
    """Whether PowerSGD at ``rank`` compresses at least one of the graph's gradients."""
    return any(compresses(*matrix_of(info.shape), rank) for info in graph.parameters.values())


def check_rank(graph: Graph, rank: int) -> None:
    """A PowerSGD rank no gradient matrix can use: one sentence."""
    matrices = [matrix_of(info.shape) for info in graph.parameters.values()]
    sides = [min(n, m) for n, m in matrices if m > 1]
    largest = max(sides, default=0)
    if rank > largest:
        raise PlanError(
            f"PowerSGD rank {rank} is larger than every gradient matrix of '{graph.model_name}' "
            f"(the largest smaller side is {largest}); use a rank of at most {largest}"
            + (", and below it for compression to pay." if largest else ".")
        )
    if not compresses_any(graph, rank):
        raise PlanError(
            f"PowerSGD rank {rank} compresses no gradient of '{graph.model_name}': no matrix shrinks "
            f"{MIN_COMPRESSION_RATE}x at that rank; use a smaller rank or no compression."
        )
